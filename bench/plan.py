"""Benchmark: `mncloud plan` and `mncloud render` wall time as ratios of `python -c "import sky"`.

All run as fresh processes in the same environment, interleaved, several times, after one
warm-up run of each (which builds mncloud's SkyPilot cache, `$MNCLOUD_HOME/sky-cache`, as the
first plan on a machine does). The figures are the ratios of the best wall times (the runs least
disturbed by other load on a shared machine) and of the medians; CPU time (user + system) is
printed beside them. Offline, SkyPilot reads the catalog snapshot named by
`MNCLOUD_CATALOG_DIR` (default: ../shared/catalogs beside the repository).
Goals (issue #15): plan ≤ 1.0×, render ≤ 0.8×, best and median alike.

    .venv/bin/python bench/plan.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAN_ARGS = ["plan", "--gpus", "H100:8", "--nodes", "4", "--hours", "24"]
#: SkyPilot alone doing the catalog read a plan needs (what `sky show-gpus H100 --all-regions`
#: does): shows how much of the plan's time is SkyPilot's catalog loading, not mncloud.
SKY_QUERY = (
    "import sky; from sky import catalog; catalog.list_accelerators(gpus_only=True, "
    "name_filter='^H100$', clouds=['aws', 'gcp', 'lambda', 'runpod'], all_regions=True, "
    "case_sensitive=False)"
)
RENDER_ARGS = [
    "render",
    str(REPO / "examples" / "train_ddp.py"),
    "--gpus",
    "H100:8",
    "--nodes",
    "4",
]
GOALS = {"mncloud plan": 1.0, "mncloud render": 0.8}


def _wall(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, with the child's own children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    args = parser.parse_args()
    env = dict(os.environ)
    shared = REPO.parent / "shared" / "catalogs"
    if "MNCLOUD_CATALOG_DIR" not in env and shared.is_dir():
        env["MNCLOUD_CATALOG_DIR"] = str(shared)
    runtime = tempfile.mkdtemp(prefix="mncloud-bench-")
    env.update(
        SKY_RUNTIME_DIR=runtime,
        MNCLOUD_HOME=str(Path(runtime) / "home"),
        SKYPILOT_DISABLE_USAGE_COLLECTION="1",
        COLUMNS="160",
    )
    baseline = [sys.executable, "-c", "import sky"]
    cli = [sys.executable, "-c", "from mncloud.cli import main; main()"]
    commands = {
        "import sky": baseline,
        "sky catalog": [sys.executable, "-c", SKY_QUERY],
        "mncloud plan": [*cli, *PLAN_ARGS],
        "mncloud render": [*cli, *RENDER_ARGS],
    }
    # Warm-up, mncloud first: it links the snapshot SkyPilot then reads, and builds the cache.
    for label in ("mncloud plan", "mncloud render", "import sky", "sky catalog"):
        _wall(commands[label], env)
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in commands}
    for _ in range(args.runs):
        for label, cmd in commands.items():
            runs[label].append(_wall(cmd, env))
    for label, timed in runs.items():
        walls = [w for w, _ in timed]
        listed = ", ".join(f"{w:.2f}" for w in walls)
        print(
            f"{label:<15} wall best {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
            f"CPU best {min(c for _, c in timed):.2f} s  ({listed})"
        )
    base = runs["import sky"]
    for label, goal in GOALS.items():
        best = min(w for w, _ in runs[label]) / min(w for w, _ in base)
        median = statistics.median(w for w, _ in runs[label]) / statistics.median(
            w for w, _ in base
        )
        cpu = min(c for _, c in runs[label]) / min(c for _, c in base)
        verdict = "ok" if max(best, median) <= goal else "OVER"
        print(
            f"{label} / import sky: {best:.2f}x wall (best), {median:.2f}x wall (median), "
            f"{cpu:.2f}x CPU; goal <= {goal}x: {verdict}"
        )
    print(f"commands: mncloud {' '.join(PLAN_ARGS)}; mncloud {' '.join(RENDER_ARGS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
