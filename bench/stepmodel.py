"""Predicted vs measured step time on this machine's local backend (issue #34).

    .venv/bin/python bench/stepmodel.py [--json]

For two sizes of `examples/train_ddp.py` (`--hidden 256` and `--hidden 1024`) it

1. profiles the script with `mncloud profile` (one process: FLOPs, operators, gradient
   bytes, the median step, this CPU's measured matmul rate);
2. measures gloo's all-reduce bus bandwidth over loopback for the gradient's size, with as
   many processes as the run will have;
3. predicts the step on 1, 2 and 3 local nodes × 2 processes with the planner's step-time
   model (`plan.stepmodel.step_time`), the "GPU" being this CPU shared by every process
   (peak = the profile's matmul rate over all cores ÷ processes; efficiency = what the
   profile measured);
4. measures it: `mncloud up --cloud local` at two step counts, (t(S2) − t(S1)) / (S2 − S1),
   so start-up and the final checkpoint cancel out;

and prints predicted / measured per case. The model is the planner's; only the hardware row
(this CPU, loopback) is made here. A ratio near 1 says the model's parts (compute scaled by
peak, all-reduce by bus bandwidth, overlap with backward) add up on hardware we can run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._local import EXAMPLE, fresh_home

SIZES = (256, 1024)
NODES = (1, 2, 3)
PROCS = 2
STEPS = (50, 450)


def gloo_busbw_gbs(ranks: int, nbytes: int, iters: int = 20) -> float:
    """Bus bandwidth (GB/s, nccl-tests' definition) of a gloo all-reduce among `ranks`
    processes on this machine, for a message of `nbytes`."""
    if ranks < 2:
        return float("inf")
    code = f"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones({max(nbytes // 4, 1)})
for _ in range(3): dist.all_reduce(t)
dist.barrier(); start = time.perf_counter()
for _ in range({iters}): dist.all_reduce(t)
dist.barrier(); took = (time.perf_counter() - start) / {iters}
if dist.get_rank() == 0: print(took)
dist.destroy_process_group()
"""
    path = Path(os.environ["MNCLOUD_HOME"]) / "allreduce.py"
    path.write_text(code)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(ranks),
            "--master_port",
            "29641",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    took = float(out.stdout.strip().splitlines()[-1])
    return 2 * (ranks - 1) / ranks * nbytes / took / 1e9


def predict(profile: Any, nodes: int, busbw: float) -> dict[str, float]:
    """The planner's step model on this CPU, shared by nodes × PROCS processes."""
    from mncloud.plan.hardware import GpuFacts, model
    from mncloud.plan.stepmodel import Workload, step_time

    # The profile ran one process with torch's threads on every core; here nodes × PROCS
    # processes share those cores, each with its share of the matmul rate.
    share = 1 / (nodes * PROCS)
    peak = profile.device_matmul_flops * share
    mfu = profile.flops_per_step / (profile.step_seconds * profile.device_matmul_flops)
    defaults = model()
    cpu = GpuFacts(
        name="cpu",
        variant="this machine's CPU",
        peak_tflops={"bf16": peak / 1e12},
        memory_gb=1e6,
        memory_bw_tbs=1,
        pcie_gbs=busbw / defaults.intra_node_achievable,
        matmul_fraction=1.0,
        source="measured here",
    )
    work = Workload(flops_per_step=profile.flops_per_step, grad_bytes=profile.grad_bytes, mfu=mfu)
    step = step_time(work, cpu, gpus_per_node=PROCS, nodes=nodes, inter_busbw_gbs=busbw)
    return {
        "predicted_s": step.step_seconds,
        "compute_s": step.compute_seconds,
        "comm_s": step.comm_seconds,
        "exposed_s": step.exposed_comm_seconds,
    }


def measure(hidden: int, nodes: int) -> float:
    """Seconds per step of a local run: the slope between two step counts."""
    exe = Path(sys.executable).parent / "mncloud"
    times = []
    for steps in STEPS:
        name = f"sm-{hidden}-{nodes}-{steps}"
        start = time.perf_counter()
        subprocess.run(
            [
                str(exe),
                "up",
                str(EXAMPLE),
                "--cloud",
                "local",
                "--nodes",
                str(nodes),
                "--gpus",
                f"cpu:{PROCS}",
                "--name",
                name,
                "--yes",
                "--recovery",
                "gang",
                "--",
                "--steps",
                str(steps),
                "--hidden",
                str(hidden),
                "--ckpt-interval",
                "100000",
                "--log-every",
                "100000",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / (STEPS[1] - STEPS[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fresh_home()
    from mncloud.plan.profile import run_profile

    rows = []
    for hidden in SIZES:
        profile = run_profile(EXAMPLE, ["--hidden", str(hidden)])
        for nodes in NODES:
            busbw = gloo_busbw_gbs(nodes * PROCS, profile.grad_bytes)
            row = {"hidden": hidden, "nodes": nodes, "procs": nodes * PROCS}
            row |= predict(profile, nodes, busbw)
            row["busbw_gbs"] = busbw
            row["measured_s"] = measure(hidden, nodes)
            row["ratio"] = row["predicted_s"] / row["measured_s"]
            rows.append(row)
            if not args.json:
                print(
                    f"hidden {hidden:5d}  {nodes} node(s) × {PROCS}: predicted "
                    f"{row['predicted_s'] * 1e3:7.2f} ms (compute {row['compute_s'] * 1e3:.2f}, "
                    f"all-reduce {row['comm_s'] * 1e3:.2f} at {busbw:.2f} GB/s, exposed "
                    f"{row['exposed_s'] * 1e3:.2f})  measured {row['measured_s'] * 1e3:7.2f} ms"
                    f"  predicted/measured {row['ratio']:.2f}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"cpu_count": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
