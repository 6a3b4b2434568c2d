"""What earlier runs measured, in place of the data file's figures (`plan --learn`).

Two figures are learned, each from the cloud runs' records (`records.observed_runs`):

- an offer's **inter-node bus bandwidth**: the newest preflight figure on that instance type.
  The preflight all-reduces with one rank per node, so on a fabric with a rail per GPU (EFA,
  TCPX, InfiniBand) a node moves its GPUs' shares at once: the node's figure is the measured
  one × GPUs per node; over TCP it is the measured one. A fabric's efficiency depends on the
  node count (`hardware.Fabric.achievable_at`), so the figure is kept as at `REFERENCE_NODES`
  and each plan rescales it to its own node count (2 nodes measured, 16 planned: × 0.6/0.83
  on EFA).
- this script's **efficiency (MFU) per GPU type**: from each earlier run of the same script
  and arguments, the FLOPs of a step over the time the model does not give to the network and
  launch overhead, × the GPU's peak; the median per GPU type. It replaces the stated default
  (and a CPU profile's guess) on that GPU type only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Protocol

from mncloud.plan import hardware
from mncloud.plan.stepmodel import OP_SECONDS, Workload, step_time


class Observed(Protocol):
    """One earlier run's figures (`records.ObservedRun`)."""

    script: str
    args: list[str]
    cloud: str
    instance_type: str
    accelerator: str
    nodes: int
    step_seconds: float | None
    busbw_gbs: float | None


def _count(accelerator: str) -> int:
    return int(accelerator.partition(":")[2] or 1)


#: The node count learned figures are kept at (`hardware.Fabric.achievable` holds from 8 on).
REFERENCE_NODES = 8


def node_busbw(observed: Sequence[Observed]) -> dict[str, float]:
    """`cloud/instance_type` → the newest measured inter-node bus bandwidth per node, GB/s,
    rescaled from the run's node count to `REFERENCE_NODES` (`at_nodes` gives it back)."""
    found: dict[str, float] = {}
    for run in observed:  # newest first
        key = f"{run.cloud}/{run.instance_type}"
        if run.busbw_gbs is None or key in found:
            continue
        net = hardware.network(run.cloud, run.instance_type)
        railed = net.fabric.key not in {"tcp", "loopback"}
        node = run.busbw_gbs * (_count(run.accelerator) if railed else 1)
        found[key] = net.fabric.rescale(node, max(run.nodes, 2), REFERENCE_NODES)
    return found


def at_nodes(learned_gbs: float, cloud: str, instance_type: str, nodes: int) -> float:
    """A `node_busbw` figure as `nodes` nodes of that instance type would get it."""
    fabric = hardware.network(cloud, instance_type).fabric
    return fabric.rescale(learned_gbs, REFERENCE_NODES, nodes)


def mfu_by_gpu(
    workload: Workload, observed: Sequence[Observed], script: str, args: list[str]
) -> dict[str, float]:
    """GPU type → the efficiency this script's earlier runs reached on it (median)."""
    busbw = node_busbw(observed)
    per_gpu: dict[str, list[float]] = {}
    for run in observed:
        if run.step_seconds is None or (run.script, run.args) != (script, list(args)):
            continue
        name = run.accelerator.partition(":")[0]
        gpu = hardware.gpu(name, run.cloud, run.instance_type)
        if gpu is None:
            continue
        net = hardware.network(run.cloud, run.instance_type)
        learned = busbw.get(f"{run.cloud}/{run.instance_type}")
        inter = (
            at_nodes(learned, run.cloud, run.instance_type, run.nodes)
            if learned
            else net.busbw_gbs(enabled=True, nodes=run.nodes)
        )
        model = step_time(
            workload, gpu, gpus_per_node=_count(run.accelerator), nodes=run.nodes,
            inter_busbw_gbs=inter,
        )  # fmt: skip
        busy = run.step_seconds - model.exposed_comm_seconds - workload.ops_per_step * OP_SECONDS
        if busy > 0:
            mfu = workload.flops_per_step / (gpu.peak_flops() * busy)
            per_gpu.setdefault(gpu.name, []).append(min(mfu, gpu.matmul_fraction))
    return {name: statistics.median(values) for name, values in per_gpu.items()}
