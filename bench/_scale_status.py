"""`status` and the run records at users' sizes (#57): ratios measured in one run, quiet and
under load, and what a 512-rank run's telemetry costs in a bucket.

    python bench/_scale_status.py [--repeats 7] [--steps 20000] [--records 1000] [--tree DIR]

`figures()` (what `bench/scale.py` calls) returns, each a ratio of medians of the same
command run alternately (`python -m mncloud`, a fresh interpreter each time, as a user runs
it), first on a quiet machine, then with a CPU-burning process per core; each of wall time
(`*_ratio_*`) and of the command's CPU time (`*_cpu_ratio_*`: its user + system seconds, what
the machine's load moves least), with the medians' seconds (`*_s_*`):

- `status NAME` of a run of 16 ranks × `--steps` steps ÷ of a 10-step run of 16 ranks, both
  live (each rank's rollup a few segments behind: the reader folds the tail), in a `file://`
  bucket (a local run's); goal ≤ 1.5;
- `status` and `runs ls` over `--records` run records ÷ over one (the README demo's run, 2 × 2
  ranks of 1,000 steps, with records the size `up` writes: its packages and task); goal ≤ 1.5.

`--tree DIR` times another checkout's `mncloud` on the same data (`--tree ../main`: before).

And, from the writer's cadence (`telemetry.series`: a segment per rank every 30 s, its rollup
every 4th) and sizes measured here (a segment of 30 steps with a loss; a rollup after
`--steps` steps), a 512-rank run (64 nodes of 8) of 72 hours at one step a second: the objects
it leaves, the bucket requests per node-hour and a `status`'s requests, priced at S3 Standard's
list prices in us-east-1 (PUT and LIST $0.005 per 1,000, GET $0.0004 per 1,000, storage
$0.023 per GB-month), against reading every segment as `status` did before rollups.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: S3 Standard, us-east-1, list prices (USD).
PUT_PER_1K = 0.005
LIST_PER_1K = 0.005
GET_PER_1K = 0.0004
GB_MONTH = 0.023
RANKS, PER_NODE, HOURS = 512, 8, 72


#: The checkout whose `mncloud` is timed (`--tree`).
TREE = ROOT


def _mncloud(home: Path, *args: str) -> tuple[float, float]:
    """Wall and CPU seconds one `mncloud ARGS` takes in a fresh interpreter (output dropped)."""
    env = {**os.environ, "MNCLOUD_HOME": str(home), "PYTHONPATH": str(TREE)}
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mncloud", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime


def _ratios(
    repeats: int, key: str, big: tuple[Path, list[str]], small: tuple[Path, list[str]]
) -> dict[str, float]:
    """`big` ÷ `small`, run alternately (a warm-up each first): the medians' ratios of wall
    and CPU time, and the medians' wall seconds; `key` names them (`status_name_load`)."""
    _mncloud(big[0], *big[1]), _mncloud(small[0], *small[1])
    runs: dict[str, list[tuple[float, float]]] = {"big": [], "small": []}
    for _ in range(repeats):
        runs["big"].append(_mncloud(big[0], *big[1]))
        runs["small"].append(_mncloud(small[0], *small[1]))
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    what, label = key.rsplit("_", 1)
    return {
        f"{what}_ratio_{label}": wall["big"] / wall["small"],
        f"{what}_cpu_ratio_{label}": cpu["big"] / cpu["small"],
        f"{what}_s_{label}": wall["big"],
        f"{what}_s_one_{label}": wall["small"],
    }


@contextlib.contextmanager
def _load() -> Iterator[None]:
    """A CPU-burning process per core while in the block."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 1)]  # fmt: skip
    try:
        time.sleep(0.5)
        yield
    finally:
        for p in burners:
            p.kill()
            p.wait()


def _telemetry_homes(work: Path, steps: int) -> tuple[Path, int, int]:
    """A home with a live run of 16 ranks × `steps` (`long`) and one of 10 steps (`short`);
    the bytes of a 30-step segment and of a rank's rollup after `steps` steps."""
    from mncloud.storage import open_bucket
    from tests.longrun import launches_of, local_run

    home = work / "telemetry-home"
    os.environ["MNCLOUD_HOME"] = str(home)
    uri = local_run("long", str(work / "bucket"), 16, launches_of(steps), close=False)
    local_run("short", str(work / "bucket"), 16, launches_of(10), close=False)
    bucket, prefix = open_bucket(uri)
    sizes = {o.key: o.size for o in bucket.list(f"{prefix}/" if prefix else "")}
    segment = statistics.median(s for k, s in sizes.items() if k.endswith(".jsonl"))
    rollup = max(s for k, s in sizes.items() if "/rollup/" in f"/{k}")
    return home, int(segment), int(rollup)


def _record_homes(work: Path, records: int) -> tuple[Path, Path]:
    """Two homes holding the README demo's run (2 × 2 ranks, 1,000 steps): with its one
    record, and with `records` records of it (the older ones copies, as reruns leave)."""
    from mncloud import layout
    from mncloud.records.lineage import installed_packages
    from mncloud.records.store import RECORD_FILE, load_current, save_record
    from mncloud.storage import write_atomic
    from tests.longrun import launches_of, local_run

    homes = []
    for count in (1, records):
        home = work / f"records-{count}"
        os.environ["MNCLOUD_HOME"] = str(home)
        local_run("demo", str(work / f"demo-bucket-{count}"), 4, launches_of(1000))
        demo = load_current("demo")
        heavy = {"packages": installed_packages(), "task_yaml": "a: 1\n" * 150}
        save_record(demo.model_copy(update=heavy))
        data = json.loads((layout.record_dir(demo.run_id) / RECORD_FILE).read_text())
        for i in range(count - 1):  # copied folders: the first read indexes them
            run_id = f"demo-20231113T{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
            copy = json.dumps(data | {"run_id": run_id, "created_at": float(i)}, indent=2)
            write_atomic(layout.record_dir(run_id) / RECORD_FILE, copy)
        homes.append(home)
    return homes[0], homes[1]


def _price(gets: float, lists: float) -> float:
    return gets * GET_PER_1K / 1000 + lists * LIST_PER_1K / 1000


def cost_512(segment_bytes: int, rollup_bytes: int) -> dict[str, float]:
    """A 512-rank run of 72 h in the bucket (module docstring), from the writer's cadence."""
    from mncloud.telemetry.rollup import ROLLUP_EVERY
    from mncloud.telemetry.series import FLUSH_INTERVAL_S

    per_rank_hour = 3600 / FLUSH_INTERVAL_S
    segments = RANKS * per_rank_hour * HOURS
    puts_node_hour = PER_NODE * per_rank_hour * (1 + 1 / ROLLUP_EVERY)
    gb = (segments * segment_bytes + RANKS * rollup_bytes) / 1e9
    # A status reads once (its stragglers and goodput share the read): a LIST of the rollups,
    # each rollup, the segments since it (a live rank's rollup 0 to ROLLUP_EVERY - 1 behind),
    # one GET that misses, and a HEAD of its last covered segment when it has no tail.
    tail = (ROLLUP_EVERY - 1) / 2
    status_gets = RANKS * (1 + tail + 1 + 1 / ROLLUP_EVERY)
    status_lists = -(-RANKS // 1000)
    old_gets, old_lists = 2 * segments, 2 * -(-segments // 1000)  # it read them twice
    return {
        "telemetry_objects_512x72h": segments + RANKS,
        "telemetry_gb_512x72h": round(gb, 3),
        "storage_usd_per_month_512x72h": round(gb * GB_MONTH, 4),
        "puts_per_node_hour": puts_node_hour,
        "put_usd_per_node_hour": round(puts_node_hour * PUT_PER_1K / 1000, 6),
        "status_requests_512": status_gets + status_lists,
        "status_usd_512": round(_price(status_gets, status_lists), 6),
        "status_requests_512_before": old_gets + old_lists,
        "status_usd_512_before": round(_price(old_gets, old_lists), 4),
        "segment_bytes": segment_bytes,
        "rollup_bytes": rollup_bytes,
    }


def figures(repeats: int = 7, steps: int = 20_000, records: int = 1000) -> dict[str, float]:
    """The ratios and the 512-rank figures (module docstring)."""
    saved = os.environ.get("MNCLOUD_HOME")
    work = Path(tempfile.mkdtemp(prefix="mncloud-scale-status-"))
    try:
        tele, segment, rollup = _telemetry_homes(work, steps)
        one, many = _record_homes(work, records)
        out: dict[str, float] = {}
        for label, ctx in (("quiet", contextlib.nullcontext()), ("load", _load())):
            with ctx:
                long, short = (tele, ["status", "long"]), (tele, ["status", "short"])
                out.update(_ratios(repeats, f"status_name_{label}", long, short))
                out.update(
                    _ratios(repeats, f"status_all_{label}", (many, ["status"]), (one, ["status"]))
                )
                ls = ["runs", "ls"]
                out.update(_ratios(repeats, f"runs_ls_{label}", (many, ls), (one, ls)))
        out.update(cost_512(segment, rollup))
        return {k: round(float(v), 4) for k, v in out.items()}
    finally:
        if saved is None:
            os.environ.pop("MNCLOUD_HOME", None)
        else:
            os.environ["MNCLOUD_HOME"] = saved
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose mncloud is timed")
    args = p.parse_args()
    global TREE
    TREE = args.tree.resolve()
    print(json.dumps(figures(args.repeats, args.steps, args.records), indent=2))


if __name__ == "__main__":
    main()
