"""Predicted vs measured step time on this machine's local backend (issue #34).

    .venv/bin/python bench/stepmodel.py [--json]

For two sizes of `examples/train_ddp.py` (`--hidden 256` and `--hidden 1024`) it

1. profiles the script with `mncloud profile` on one thread, as each local rank runs (FLOPs,
   operators, gradient bytes, the median step, this CPU's measured matmul rate);
2. measures gloo's all-reduce bus bandwidth over loopback for one step's gradient, one call
   per parameter tensor as the example's exact DDP makes them, with as many processes as the
   run will have (the figure the preflight's bandwidth test gives a plan on a cloud);
3. predicts the step on 1, 2 and 3 local nodes × 2 processes with the planner's step-time
   model (`plan.stepmodel.step_time`), the "GPU" being this CPU shared by every process
   (peak = the profile's one-thread matmul rate × cores ÷ processes, at most 1×;
   efficiency = what the profile measured; overlap 0 once the ranks fill the cores: gloo
   reduces on the same cores, so nothing hides the all-reduce — the ratio with a GPU's
   overlap is printed beside it);
4. measures it: `mncloud up --cloud local`, the median interval between rank 0's steps in
   its telemetry after 20 steps of warm-up;

and prints predicted / measured per case. The model is the planner's; only the hardware row
(this CPU, loopback) is made here. A ratio near 1 says the model's parts (compute scaled by
peak, all-reduce by bus bandwidth, overlap with backward) add up on hardware we can run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._local import EXAMPLE, fresh_home, progress_lines

SIZES = (256, 1024)
NODES = (1, 2, 3)
PROCS = 2
STEPS = 300
WARMUP = 20


def example_tensors(hidden: int) -> list[int]:
    """Element counts of `examples/train_ddp.py`'s parameters (weights and biases), in the
    order DDP all-reduces them."""
    shapes = [(64, hidden), (hidden, hidden), (hidden, 10)]
    return [n for a, b in reversed(shapes) for n in (b, a * b)]


def gloo_busbw_gbs(ranks: int, sizes: list[int], iters: int = 30) -> float:
    """Bus bandwidth (GB/s, nccl-tests' definition) of gloo all-reducing one step's gradient
    among `ranks` processes here, one asynchronous call per tensor as the example's exact DDP
    makes them."""
    if ranks < 2:
        return float("inf")
    nbytes = 4 * sum(sizes)
    code = f"""
import os, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
grads = [torch.ones(n) for n in {sizes!r}]
def step():  # launched as DDP's hooks launch them, then waited for
    for work in [dist.all_reduce(g, async_op=True) for g in grads]: work.wait()
for _ in range(3): step()
dist.barrier(); start = time.perf_counter()
for _ in range({iters}): step()
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


def predict(
    profile: Any, nodes: int, busbw: float, *, overlap: float | None = None
) -> dict[str, float]:
    """The planner's step model on this CPU, shared by nodes × PROCS processes.

    `overlap`: the share of backward that hides the all-reduce (None: the model's, made for
    GPUs, where NCCL runs beside the compute). On this CPU gloo's all-reduce runs on the cores
    the ranks compute on: with as many ranks as cores, none is idle to hide it behind backward
    (`cpu_overlap`).
    """
    from mncloud.plan.hardware import GpuFacts, model
    from mncloud.plan.stepmodel import Workload, step_time

    # The profile ran one process on one thread, as each local rank runs (torchrun sets
    # OMP_NUM_THREADS=1); nodes × PROCS such processes share this machine's cores.
    share = min(1.0, (os.cpu_count() or 1) / (nodes * PROCS))
    peak = profile.device_matmul_flops * share
    mfu = profile.flops_per_step / (profile.step_seconds * profile.device_matmul_flops)
    defaults = model()
    if overlap is not None:
        defaults = defaults.model_copy(update={"overlap": overlap})
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
    step = step_time(
        work, cpu, gpus_per_node=PROCS, nodes=nodes, inter_busbw_gbs=busbw, defaults=defaults
    )
    return {
        "predicted_s": step.step_seconds,
        "compute_s": step.compute_seconds,
        "comm_s": step.comm_seconds,
        "exposed_s": step.exposed_comm_seconds,
    }


def cpu_overlap(nodes: int) -> float | None:
    """This CPU's overlap: 0 when the ranks fill every core (see `predict`), else the model's."""
    return 0.0 if nodes * PROCS >= (os.cpu_count() or 1) else None


def measure(hidden: int, nodes: int) -> float:
    """Median seconds per step of a local run, from rank 0's steps in its telemetry (the
    first `WARMUP` steps left out)."""
    import statistics

    from mncloud.layout import run_dir

    exe = Path(sys.executable).parent / "mncloud"
    name = f"sm-{hidden}-{nodes}"
    subprocess.run(
        [str(exe), "up", str(EXAMPLE), "--cloud", "local", "--nodes", str(nodes),
         "--gpus", f"cpu:{PROCS}", "--name", name, "--yes", "--recovery", "gang", "--",
         "--steps", str(STEPS), "--hidden", str(hidden), "--ckpt-interval", "100000",
         "--log-every", "100000"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    times = [r["t"] for r in progress_lines(run_dir(name)) if "event" not in r]
    return statistics.median(b - a for a, b in itertools.pairwise(times[WARMUP:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fresh_home()
    os.environ["MNCLOUD_CPU_THREADS"] = "1"  # the profile's thread count: a local rank's
    from mncloud.plan.profile import run_profile

    rows = []
    for hidden in SIZES:
        profile = run_profile(EXAMPLE, ["--hidden", str(hidden)])
        for nodes in NODES:
            busbw = gloo_busbw_gbs(nodes * PROCS, example_tensors(hidden))
            row = {"hidden": hidden, "nodes": nodes, "procs": nodes * PROCS}
            row |= predict(profile, nodes, busbw, overlap=cpu_overlap(nodes))
            gpu_overlap = predict(profile, nodes, busbw)["predicted_s"]
            row["busbw_gbs"] = busbw
            row["measured_s"] = measure(hidden, nodes)
            row["ratio"] = row["predicted_s"] / row["measured_s"]
            row["ratio_gpu_overlap"] = gpu_overlap / row["measured_s"]
            rows.append(row)
            if not args.json:
                print(
                    f"hidden {hidden:5d}  {nodes} node(s) × {PROCS}: predicted "
                    f"{row['predicted_s'] * 1e3:7.2f} ms (compute {row['compute_s'] * 1e3:.2f}, "
                    f"all-reduce {row['comm_s'] * 1e3:.2f} at {busbw:.2f} GB/s, exposed "
                    f"{row['exposed_s'] * 1e3:.2f})  measured {row['measured_s'] * 1e3:7.2f} ms"
                    f"  predicted/measured {row['ratio']:.2f} (with a GPU's overlap "
                    f"{row['ratio_gpu_overlap']:.2f})",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"cpu_count": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
