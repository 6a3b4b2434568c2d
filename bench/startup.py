"""bench/startup: cold start and resume of the README demo, median of N, one tree or two.

    .venv/bin/python bench/startup.py [--runs 3] [--before /tmp/warm-before] [--json]

Each run is exactly the README demo, detached, in a fresh MNCLOUD_HOME:

    mncloud up examples/train_ddp.py --cloud local --nodes 2 --gpus cpu:2 --name demo \\
        --recovery gang --chaos-preempt-after 8s

and, once the step after the preemption is in, `mncloud down --now` (the rest of the training
tells nothing more). Its figures are the demo summary's: cold start (first launch → first step)
and resume (preemption → first step after the relaunch, `--recovery-delay` 2 s included).
With `--before DIR` (another checkout, e.g. `git worktree add /tmp/warm-before main`) the runs
alternate before, after, before, … so both trees see the same load; each tree runs as
`python -m mncloud` with its own PYTHONPATH. The load average is read before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _local import EXAMPLE, REPO, fresh_home, wait

DEMO = ["--cloud", "local", "--nodes", "2", "--gpus", "cpu:2", "--name", "demo",
        "--recovery", "gang", "--chaos-preempt-after", "8s"]  # fmt: skip


def cli(tree: Path, *args: str) -> None:
    """`python -m mncloud ARGS` of `tree` (its own PYTHONPATH), in the bench's MNCLOUD_HOME."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "mncloud", *args], check=True, env=env,
                   cwd=tree, capture_output=True, text=True)  # fmt: skip


def one_run(tree: Path) -> dict[str, float]:
    """The demo on `tree` until its resumed step; its cold start and resume in seconds."""
    from mncloud.backends.local.figures import recovery_figures
    from mncloud.layout import run_dir

    fresh_home()
    cli(tree, "up", str(tree / EXAMPLE.relative_to(REPO)), *DEMO, "--detach")
    folder = run_dir("demo")
    try:
        fig = wait(lambda: (f := recovery_figures(folder)).resume_s and f, 600, "the resume")
    finally:
        cli(tree, "down", "demo", "--now")
    assert fig.cold_start_s is not None
    return {"cold_start_s": fig.cold_start_s, "resume_s": fig.resume_s[0]}


def main() -> None:
    p = argparse.ArgumentParser(description="Cold start and resume of the README demo.")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--before", type=Path, default=None, help="the tree to compare against")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    trees = {"after": REPO} if args.before is None else {"before": args.before, "after": REPO}
    load = [round(x, 2) for x in os.getloadavg()]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for i in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(one_run(tree.resolve()))
            print(f"run {i + 1} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    result = {
        name: {
            "cold_start_s": statistics.median(r["cold_start_s"] for r in rs),
            "resume_s": statistics.median(r["resume_s"] for r in rs),
            "runs": rs,
        }
        for name, rs in runs.items()
    }
    result["load_before"] = load
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"load average (1, 5, 15 min): {load} before, {result['load_after']} after")
    for name in trees:
        r = result[name]
        print(f"{name:>6}: cold start {r['cold_start_s']:.1f} s, resume {r['resume_s']:.1f} s "
              f"(median of {args.runs})")  # fmt: skip


if __name__ == "__main__":
    main()
