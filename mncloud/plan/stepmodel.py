"""How long one optimizer step of this script takes on an offer: compute plus exposed network.

Pure functions over a `Workload` (what one replica does per step: from `mncloud profile`, or
from `plan` flags) and the hardware facts (`plan.hardware`, a data file with sources).

For one GPU of an offer with N nodes × k GPUs (n = N·k ranks, DDP: every rank its own batch):

    compute  = ops × op_s + F / (peak × mfu)
        F: model FLOPs of one rank's step (FlopCounterMode over forward and backward);
        ops: operators dispatched per step, each ~`OP_SECONDS` of launch overhead on a GPU,
        the floor a small model never gets under; peak: the GPU's dense bf16 FLOP/s;
        mfu: the share of peak the matmuls reach (stated default, or measured: a GPU profile).
    intra    = 2(k−1)/k · S / busbw_node        (NVLink or PCIe phase; 0 on one GPU)
    inter    = 2(N−1)/N · S / busbw_network     (hierarchical all-reduce; 0 on one node)
        S: gradient bytes (what DDP all-reduces); busbw: the link's rate × its achievable
        fraction (nccl-tests' bus bandwidth), `hardware.Network.busbw_gbs`.
    exposed  = max(0, intra + inter − overlap · backward_share · (compute − launch overhead))
        DDP all-reduces buckets while backward still runs: that much of it is hidden.
    step     = compute + exposed

Worked example (the test `test_stepmodel_worked_example` checks every figure): a 1.3B-parameter
model, 8,192 tokens per rank per step, fp32 gradients, on 4 × p5.48xlarge (8 × H100, EFA on,
all 32 cards), 1,000 operators per step, the stated defaults (mfu 0.4, overlap 0.5, backward
share 0.667, NVLink achievable 0.77, EFA 0.6):

    F       = 6 · 1.3e9 · 8192                      = 6.39e13 FLOP
    compute = 1000 · 10e-6 + 6.39e13 / (989e12 · 0.4) = 0.0100 + 0.1615 = 0.1715 s
    S       = 1.3e9 · 4 B                           = 5.2 GB
    intra   = 2·7/8 · 5.2 / (900/2 · 0.77)          = 9.1 / 346.5   = 0.0263 s
    inter   = 2·3/4 · 5.2 / (3200/8 · 0.6)          = 7.8 / 240     = 0.0325 s
    exposed = max(0, 0.0588 − 0.5 · 0.667 · 0.1615) = 0.0049 s
    step    = 0.1764 s: compute-bound. With EFA off (TCP, 100 Gbps × 0.12 = 1.5 GB/s) inter is
              5.2 s, the step 5.34 s: the network decides.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from mncloud.plan import hardware
from mncloud.plan.hardware import GpuFacts, ModelDefaults

#: Launch overhead per dispatched operator on a GPU, eager PyTorch: the floor of a small step.
OP_SECONDS = 10e-6
GIB = 2**30


class Workload(BaseModel):
    """What one replica (one GPU's rank) does per optimizer step."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    flops_per_step: float = Field(gt=0)
    """Model FLOPs of one rank's step, forward and backward."""
    ops_per_step: int = Field(0, ge=0)
    """Operators dispatched per step (0: unknown, no launch floor)."""
    grad_bytes: float = Field(0, ge=0)
    """Gradient bytes all-reduced per step: Σ numel · element size of trainable parameters."""
    weight_bytes: float = Field(0, ge=0)
    optimizer_bytes: float = Field(0, ge=0)
    activation_bytes: float = Field(0, ge=0)
    """Tensors saved for backward at the step's peak (measured on a GPU, counted on CPU)."""
    mfu: float | None = Field(None, gt=0, le=1)
    """Measured share of peak the matmuls reach (a GPU profile); None: the stated default."""
    mfu_source: str = ""
    mfu_by_gpu: dict[str, float] = Field(default_factory=dict)
    """GPU type → the efficiency earlier runs of this script measured there (`--learn`): wins
    over `mfu` on that type."""

    @property
    def memory_bytes(self) -> float:
        """What one GPU holds under DDP: weights, gradients, optimizer state, activations."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes


class Bound(str, Enum):
    """What a step's time is mostly made of."""

    COMPUTE = "compute"
    NETWORK = "network"
    OVERHEAD = "overhead"


class StepTime(BaseModel):
    """One offer's step, and what it is made of."""

    model_config = ConfigDict(frozen=True)

    step_seconds: float
    compute_seconds: float
    """Launch overhead plus FLOPs at the assumed efficiency."""
    comm_seconds: float
    """The whole gradient all-reduce (intra- plus inter-node), before overlap."""
    exposed_comm_seconds: float
    """The part of `comm_seconds` that the backward pass does not hide."""
    overhead_seconds: float
    mfu: float
    intra_busbw_gbs: float | None
    inter_busbw_gbs: float | None
    bound: Bound


def compute_seconds(
    workload: Workload, gpu: GpuFacts, defaults: ModelDefaults, dtype: str = "bf16"
) -> tuple[float, float, float]:
    """(compute seconds, launch overhead seconds, the efficiency assumed) on one GPU."""
    measured = workload.mfu_by_gpu.get(gpu.name) or workload.mfu
    mfu = min(measured or defaults.mfu, gpu.matmul_fraction)
    overhead = workload.ops_per_step * OP_SECONDS
    return overhead + workload.flops_per_step / (gpu.peak_flops(dtype) * mfu), overhead, mfu


def allreduce_seconds(nbytes: float, ranks: int, busbw_gbs: float) -> float:
    """An all-reduce of `nbytes` over `ranks` at bus bandwidth `busbw_gbs` (nccl-tests)."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (busbw_gbs * 1e9)


def intra_node_busbw_gbs(gpu: GpuFacts, defaults: ModelDefaults) -> float:
    """All-reduce bus bandwidth among one node's GPUs: NVLink one way, else PCIe."""
    link = gpu.nvlink_gbs / 2 if gpu.nvlink_gbs else gpu.pcie_gbs
    return link * defaults.intra_node_achievable


def step_time(
    workload: Workload,
    gpu: GpuFacts,
    *,
    gpus_per_node: int,
    nodes: int,
    inter_busbw_gbs: float | None,
    defaults: ModelDefaults | None = None,
) -> StepTime:
    """The step on `nodes` × `gpus_per_node` of `gpu`, nodes joined at `inter_busbw_gbs`."""
    defaults = defaults or hardware.model()
    compute, overhead, mfu = compute_seconds(workload, gpu, defaults)
    intra_bw = intra_node_busbw_gbs(gpu, defaults) if gpus_per_node > 1 else None
    intra = allreduce_seconds(workload.grad_bytes, gpus_per_node, intra_bw or 1.0)
    inter_bw = inter_busbw_gbs if nodes > 1 else None
    inter = allreduce_seconds(workload.grad_bytes, nodes, inter_bw or 1.0) if inter_bw else 0.0
    hidden = defaults.overlap * defaults.backward_share * (compute - overhead)
    exposed = max(0.0, intra + inter - hidden)
    if exposed > compute:
        bound = Bound.NETWORK
    else:
        bound = Bound.OVERHEAD if overhead > compute - overhead else Bound.COMPUTE
    return StepTime(
        step_seconds=compute + exposed,
        compute_seconds=compute,
        comm_seconds=intra + inter,
        exposed_comm_seconds=exposed,
        overhead_seconds=overhead,
        mfu=mfu,
        intra_busbw_gbs=intra_bw,
        inter_busbw_gbs=inter_bw,
        bound=bound,
    )


def fits(workload: Workload, memory_gib: float, defaults: ModelDefaults | None = None) -> bool:
    """Whether one GPU of `memory_gib` holds the replica within the stated headroom."""
    defaults = defaults or hardware.model()
    return workload.memory_bytes <= memory_gib * GIB * defaults.memory_headroom


def measured_mfu(
    flops_per_step: float, ops_per_step: int, step_seconds: float, peak_flops: float
) -> float:
    """The efficiency a measured step implies: FLOPs over (time less launch overhead) × peak."""
    busy = max(step_seconds - ops_per_step * OP_SECONDS, step_seconds * 0.05)
    return flops_per_step / (busy * peak_flops)
