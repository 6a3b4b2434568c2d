"""bench/elastic: an elastic spot run (`--min-nodes`) against the gang that waits, on one trace.

    .venv/bin/python bench/elastic.py [--nodes 2] [--min-nodes 1] [--steps 120]

Runs `examples/train_fsdp.py` twice under `mncloud up --cloud local --spot-trace` (no deadline:
spot only), one run after the other (`--together`: both at once, so that both see the same
load on a shared machine), on the same trace: all `--nodes` offered for the first
third of the run's expected length, `--min-nodes` for the next third, all again after. Each
step trains the same global batch; a step's accelerator time is modeled by `--compute-ms` per
micro-batch, so a smaller world takes proportionally longer steps (the CPU work itself is
small). Without `--min-nodes` the gang waits out the dip; with it, the run trains on the nodes
offered and grows back at its next checkpoint. Reports the wall time from the controller's
start to the run's end, the launches, and checks each run's committed steps trained every
sample once per epoch with the same global batch.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
from typing import Any

from _local import REPO, fresh_home, mncloud, wait

EXAMPLE = REPO / "examples" / "train_fsdp.py"
BATCH, SAMPLES, MICRO = 8, 80, 2
SCALE, GAP = 30, 60  # a 60 s tick of the trace passes in 2 s


def start(name: str, trace: Path, args: argparse.Namespace, elastic: bool) -> None:
    """`mncloud up` of one run: it returns once the run's controller is started."""
    samples = Path(trace.parent / f"samples-{name}")
    train = ["--steps", str(args.steps), "--global-batch", str(BATCH), "--micro-batch",
             str(MICRO), "--samples", str(SAMPLES), "--ckpt-interval", "5", "--compute-ms",
             str(args.compute_ms), "--log-every", "1000", "--parallel", "ddp",
             "--sample-log", str(samples)]  # fmt: skip
    flags = ["--min-nodes", str(args.min_nodes)] if elastic else []
    mncloud("up", str(EXAMPLE), "--cloud", "local", "--name", name, "--yes", "--nodes",
            str(args.nodes), "--gpus", "cpu:1", "--recovery", "gang", "--spot-trace", str(trace),
            "--time-scale", str(SCALE), *flags, "--", *train)  # fmt: skip


def result(name: str, trace: Path, args: argparse.Namespace, elastic: bool) -> dict[str, Any]:
    """Wait for the run's controller to end; its wall time, launches and sample check."""
    from mncloud import control

    samples = Path(trace.parent / f"samples-{name}")
    state = wait(lambda: (s := control.load_state(name)).final and s, 3600, name)
    assert state.phase == "finished", state.detail
    ended = max(d.time for d in state.decisions)
    steps = committed(samples, state.run_ids)
    worlds = collections.Counter(s["world"] for s in steps.values())
    once = all(
        sorted(i for k in range(e * 10 + 1, e * 10 + 11) for i in steps[k]["ids"])
        == list(range(SAMPLES))
        for e in range(args.steps // 10)
    )
    return {
        "run": "elastic" if elastic else "gang waits",
        "wall_s": round(ended - (state.started_at or ended), 1),
        "launches": len(state.run_ids),
        "steps_by_world": dict(sorted(worlds.items())),
        "global_batch": sorted({len(s["ids"]) for s in steps.values()}),
        "each_sample_once_per_epoch": once and sorted(steps) == list(range(1, args.steps + 1)),
    }


def committed(folder: Path, launches: list[str]) -> dict[int, dict[str, Any]]:
    """Step → the world and ids of the launch that trained it last (as tests/test_elastic.py)."""
    by_step: dict[int, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for f in folder.glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            seen = by_step[r["step"]].setdefault(r["run"], {"world": r["world"], "ids": []})
            seen["ids"] += r["ids"]
    return {s: runs[max(runs, key=launches.index)] for s, runs in by_step.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--min-nodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--compute-ms", type=float, default=500.0)
    p.add_argument("--third-s", type=float, default=90.0,
                   help="wall seconds of each third of the trace")  # fmt: skip
    p.add_argument("--together", action="store_true",
                   help="run both at once (a shared machine), not one after the other")  # fmt: skip
    args = p.parse_args()
    home = fresh_home()
    third = round(args.third_s * SCALE / GAP)
    trace = home / "trace.json"
    data = [args.nodes] * third + [args.min_nodes] * third + [args.nodes]
    trace.write_text(json.dumps({"metadata": {"gap_seconds": GAP}, "data": data}))
    started = time.time()
    runs = [("gang", False), ("stretch", True)]
    if args.together:  # both under the same load: the ratio holds on a busy machine
        for name, elastic in runs:
            start(name, trace, args, elastic)
        rows = [result(name, trace, args, elastic) for name, elastic in runs]
    else:
        rows = []
        for name, elastic in runs:
            start(name, trace, args, elastic)
            rows.append(result(name, trace, args, elastic))
    for row in rows:
        print(json.dumps(row))
    ratio = rows[1]["wall_s"] / rows[0]["wall_s"]
    shape = f"{args.nodes} → {args.min_nodes} → {args.nodes} nodes, {args.third_s:g} s a third"
    print(f"elastic / gang wall time: {ratio:.2f} (trace {shape}; {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
