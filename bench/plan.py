"""Benchmark: `mncloud plan` wall time as a ratio of a bare `python -c "import sky"`.

Both run as fresh processes in the same environment, interleaved, several times. The figure is
the ratio of the best wall times (the runs least disturbed by other load on a shared machine);
the ratio of the medians and of CPU time (user + system) are printed beside it. Offline,
SkyPilot reads the catalog snapshot named by `MNCLOUD_CATALOG_DIR` (default: ../shared/catalogs
beside the repository). Goal: ≤ 1.5×.

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
GOAL = 1.5


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
    plan = [sys.executable, "-c", "from mncloud.cli import main; main()", *PLAN_ARGS]
    _wall(plan, env)  # warm-up: links the catalog snapshot, creates SkyPilot's state
    _wall(baseline, env)
    query = [sys.executable, "-c", SKY_QUERY]
    sky_runs, query_runs, plan_runs = [], [], []
    for _ in range(args.runs):
        sky_runs.append(_wall(baseline, env))
        query_runs.append(_wall(query, env))
        plan_runs.append(_wall(plan, env))
    for label, runs in (
        ("import sky", sky_runs),
        ("sky catalog", query_runs),
        ("mncloud plan", plan_runs),
    ):
        walls = [w for w, _ in runs]
        listed = ", ".join(f"{w:.2f}" for w in walls)
        print(
            f"{label:<13} wall best {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
            f"CPU best {min(c for _, c in runs):.2f} s  ({listed})"
        )
    ratio = min(w for w, _ in plan_runs) / min(w for w, _ in sky_runs)
    median_ratio = statistics.median(w for w, _ in plan_runs) / statistics.median(
        w for w, _ in sky_runs
    )
    cpu_ratio = min(c for _, c in plan_runs) / min(c for _, c in sky_runs)
    verdict = "ok" if ratio <= GOAL else "OVER"
    print(
        f"ratio {ratio:.2f}x wall (best), {median_ratio:.2f}x wall (median), "
        f"{cpu_ratio:.2f}x CPU; goal <= {GOAL}x wall: {verdict}"
    )
    own = min(w for w, _ in plan_runs) / min(w for w, _ in query_runs)
    print(f"mncloud plan / SkyPilot's own catalog query: {own:.2f}x wall (best)")
    print(f"command: mncloud {' '.join(PLAN_ARGS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
