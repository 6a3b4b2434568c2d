"""bench/exec: local `mncloud exec` vs a fresh `mncloud up --cluster`, to the first step.

    .venv/bin/python bench/exec.py [--rounds 3] [--nodes 2] [--json]

A copy of `examples/train_ddp.py` in a project folder of its own with a `requirements.txt`
(numpy and torch, both installed already, so pip only checks them, offline), as a project
that fixes a typo and runs again has one. Each round:

- fresh: `mncloud up train.py --cloud local --nodes N --gpus cpu:2 --cluster --requirements
  requirements.txt --detach -- --steps 60`, from the command's start to the first training
  step rank 0 reports (its telemetry segments): CLI, render, run record, supervisor, setup (pip on
  every node, one after the other, as the local nodes share a folder) while the nodes' warm
  hosts start, the preflight, torchrun, the script's imports (in workers forked from a host
  where it is ready, cold where not), rendezvous, the first step;
- exec: once that run ended, `mncloud exec NAME --detach --restart` (from step 0, so both
  train the same steps), timed the same way: no setup (it ran when the nodes came up, as
  `sky.exec` skips setup and provisioning on a cluster kept up), no preflight, and every
  worker forked from its node's warm host, torch and mncloud.train already imported
  (`backends/local/warm.py`); torchrun's agent still imports torch on each node.

Each round ends with `mncloud down NAME --now`, which stops its hosts.

`--no-requirements` drops the requirements file: then the two differ only by what a fresh
`up` does besides setup. The figure is the median ratio exec / fresh (lower is better; the
goal is < 0.5). On a cloud the fresh side also provisions VMs (minutes), which exec skips.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _local import EXAMPLE, fresh_home, mncloud, wait


def project(requirements: bool) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="mncloud-bench-exec-"))
    (folder / "pyproject.toml").write_text("[project]\nname = 'bench-exec'\n")
    shutil.copy(EXAMPLE, folder / "train.py")
    if requirements:
        (folder / "requirements.txt").write_text("numpy\ntorch\n")
    return folder


def first_step_after(name: str, t0: float, timeout: float = 600) -> float:
    """Seconds from `t0` to the first step rank 0 reported after it (its telemetry)."""
    from mncloud.backends.local.state import series_uri
    from mncloud.layout import run_dir
    from mncloud.telemetry.seriestail import SeriesTail

    tails: dict[str, SeriesTail] = {}

    def found() -> float | None:
        uri = series_uri(run_dir(name))
        tail = tails.setdefault(uri, SeriesTail(uri)) if uri else None
        times = [r.t for r in tail.read().steps if r.rank == 0 and r.t >= t0] if tail else []
        return min(times) - t0 if times else None

    return wait(found, timeout, f"the first step of {name}")


def ended(name: str) -> None:
    from mncloud.backends.local.state import load_state
    from mncloud.layout import run_dir

    wait(lambda: load_state(run_dir(name)).state.is_final, 900, f"{name} to end")


def one_round(k: int, folder: Path, nodes: int, requirements: bool) -> tuple[float, float]:
    name = f"exec-bench-{k}"
    setup = ["--requirements", str(folder / "requirements.txt")] if requirements else []
    t0 = time.time()
    mncloud("up", str(folder / "train.py"), "--cloud", "local", "--nodes", str(nodes),
            "--gpus", "cpu:2", "--name", name, "--detach", "--yes", "--recovery", "gang",
            "--cluster", *setup, "--", "--steps", "60", "--ckpt-interval", "20")  # fmt: skip
    fresh = first_step_after(name, t0)
    ended(name)
    t1 = time.time()
    mncloud("exec", name, "--detach", "--restart")
    again = first_step_after(name, t1)
    ended(name)
    mncloud("down", name, "--now")
    return fresh, again


def main() -> None:
    p = argparse.ArgumentParser(
        description="Local exec vs a fresh up --cluster: time to the first step."
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--no-requirements", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fresh_home()
    requirements = not args.no_requirements
    folder = project(requirements)
    rounds = [one_round(k, folder, args.nodes, requirements) for k in range(args.rounds)]
    fresh = statistics.median(r[0] for r in rounds)
    again = statistics.median(r[1] for r in rounds)
    ratios = [round(r[1] / r[0], 3) for r in rounds]
    result = {
        "nodes": args.nodes,
        "requirements": requirements,
        "fresh_up_first_step_s": [round(r[0], 2) for r in rounds],
        "exec_first_step_s": [round(r[1], 2) for r in rounds],
        "ratio_each": ratios,
        "ratio_median": statistics.median(ratios),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    import mncloud as package

    print(f"mncloud from {Path(package.__file__).parent}")
    print(f"time to first step, {args.nodes} local nodes × 2 processes, {args.rounds} rounds"
          f"{' (requirements.txt: numpy, torch)' if requirements else ' (no setup)'}:")  # fmt: skip
    print(f"  fresh up   {fresh:6.2f} s (median; {result['fresh_up_first_step_s']})")
    print(f"  exec       {again:6.2f} s (median; {result['exec_first_step_s']})")
    median = result["ratio_median"]
    print(f"  ratio      {median:.2f} (exec / fresh, median of {ratios}; goal < 0.5)")


if __name__ == "__main__":
    main()
