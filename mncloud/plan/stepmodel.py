"""How long one optimizer step of this script takes on an offer: compute plus exposed network.

Pure functions over a `Workload` (what one replica does per step: from `mncloud profile`, or
from `plan` flags) and the hardware facts (`plan.hardware`, a data file with sources).

For one GPU of an offer with N nodes × k GPUs (n = N·k ranks, every rank its own batch,
split into m micro-batches):

    compute  = ops × op_s + max((F + κ·R) / (peak × mfu), memory) + optimizer
        F: model FLOPs of one rank's step (6·params + 12·layers·hidden·seq per token, or
        FlopCounterMode over forward and backward); R: what recomputation adds (full: one more
        forward, F/3; selective: the attention core's forward), priced at κ
        (`recompute_time_share`: runs that recompute reach a higher efficiency); ops: operators
        dispatched per step, each ~`OP_SECONDS` of launch overhead; peak: the GPU's dense bf16
        FLOP/s; mfu: the GPU type's published efficiency (hardware.yaml, with its source), or a
        measured one (a GPU profile, `--learn`); memory: the pass's floor in memory traffic
        (weights read twice, gradients written, activations written and read, at
        `memory_bw_tbs`: small batches are memory-bound); optimizer: AdamW reads and writes
        the GPU's share of weights, gradients and moments once, at `memory_bw_tbs`.
    DDP      comm = 2(k−1)/k · S / busbw_node + 2(N−1)/N · S / busbw_network   (once per step)
             exposed = max(0, comm − overlap · backward of the last micro-batch)
    FSDP     per micro-batch: all-gather forward, all-gather backward, reduce-scatter, each
             (n−1)/n · P / bw (P: bf16 parameters; bw: the network's between nodes, NVLink on
             one node); the all-gathers are on the critical path:
             exposed = m · (max(0, ag − forward) + max(0, ag + rs − backward))
    HSDP     the same over NVLink inside a node, plus the gradient all-reduce across nodes once
             per step, 2(N−1)/N · P / busbw_network, hidden like DDP's.
    step     = compute + exposed

S: gradient bytes (what DDP all-reduces); busbw: the link's rate × its achievable fraction at
this node count (nccl-tests' bus bandwidth), `hardware.Network.busbw_gbs`. Which parallelism
and recomputation a replica needs is `plan.sharding`'s question.

Worked example (the test `test_stepmodel_worked_example` checks every figure): a 1.3B-parameter
model, 8,192 tokens per rank per step, fp32 gradients (the only state given), on 4 × p5.48xlarge
(8 × H100, EFA on, all 32 cards), 1,000 operators per step, DDP, H100's efficiency 0.41,
overlap 0.9, NVLink achievable 0.77, EFA 0.83 at 2 nodes and 0.6 from 8 (0.715 at 4):

    F       = 6 · 1.3e9 · 8192                        = 6.39e13 FLOP
    compute = 1000 · 10e-6 + 6.39e13 / (989e12 · 0.41) + 2 · 5.2e9 / 3.35e12
            = 0.0100 + 0.1576 + 0.0031                 = 0.1707 s
    S       = 1.3e9 · 4 B                             = 5.2 GB
    intra   = 2·7/8 · 5.2 / (900/2 · 0.77)            = 9.1 / 346.5  = 0.0263 s
    inter   = 2·3/4 · 5.2 / (3200/8 · 0.715)          = 7.8 / 286    = 0.0273 s
    exposed = max(0, 0.0536 − 0.9 · ⅔ · 0.1607)      = 0 s
    step    = 0.1707 s: compute-bound. With EFA off (TCP, 100 Gbps × 0.12 = 1.5 GB/s) inter is
              5.2 s, the step 5.30 s: the network decides.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from mncloud.plan import hardware
from mncloud.plan.hardware import GpuFacts, ModelDefaults
from mncloud.spec import Parallel

#: Launch overhead per dispatched operator on a GPU, eager PyTorch: the floor of a small step.
OP_SECONDS = 10e-6
GIB = 2**30
#: Bytes per parameter a sharded run moves (bf16 mixed precision: gathered and reduced in bf16).
SHARD_BYTES_PER_PARAM = 2


class Workload(BaseModel):
    """What one replica (one GPU's rank) does per optimizer step."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    flops_per_step: float = Field(gt=0)
    """Model FLOPs of one rank's step, forward and backward (recomputation not included)."""
    ops_per_step: int = Field(0, ge=0)
    """Operators dispatched per step (0: unknown, no launch floor)."""
    grad_bytes: float = Field(0, ge=0)
    """Gradient bytes all-reduced per step: Σ numel · element size of trainable parameters."""
    weight_bytes: float = Field(0, ge=0)
    optimizer_bytes: float = Field(0, ge=0)
    activation_bytes: float = Field(0, ge=0)
    """Tensors saved for backward at the step's peak (measured on a GPU, counted on CPU, or
    34 bytes × hidden × layers per token of a micro-batch from flags: Korthikanti et al.)."""
    params: float = Field(0, ge=0)
    """Parameters (0: unknown; then weight_bytes / 4)."""
    layers: int | None = Field(None, gt=0)
    hidden: int | None = Field(None, gt=0)
    seq_len: int | None = Field(None, gt=0)
    tokens_per_step: float | None = Field(None, gt=0)
    """Tokens one rank processes per optimizer step (all its micro-batches)."""
    micro_batches: int = Field(1, ge=1)
    """Micro-batches per step: DDP communicates once per step, FSDP per micro-batch."""
    recompute: str | None = None
    """`none`, `selective`, `full`; None: the least that fits (`plan.sharding`)."""
    mfu: float | None = Field(None, gt=0, le=1)
    """Measured share of peak the matmuls reach (a GPU profile); None: the GPU's default."""
    mfu_source: str = ""
    mfu_by_gpu: dict[str, float] = Field(default_factory=dict)
    """GPU type → the efficiency earlier runs of this script measured there (`--learn`): wins
    over `mfu` on that type."""

    @property
    def memory_bytes(self) -> float:
        """What one GPU holds under DDP: weights, gradients, optimizer state, activations."""
        return self.state_bytes + self.activation_bytes

    @property
    def state_bytes(self) -> float:
        """Weights, gradients and optimizer state: what FSDP shards."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def param_count(self) -> float:
        return self.params or self.weight_bytes / 4

    @property
    def shard_bytes(self) -> float:
        """P: the bytes one all-gather (or reduce-scatter) of every parameter moves."""
        return SHARD_BYTES_PER_PARAM * self.param_count

    def recompute_flops(self, recompute: str | None) -> float:
        """What recomputation adds to a step: full, one more forward (a third of F);
        selective, the attention core's forward (4 · layers · hidden · seq per token)."""
        if recompute == "full":
            return self.flops_per_step / 3
        if recompute == "selective" and self.layers and self.hidden and self.seq_len:
            return 4 * self.layers * self.hidden * self.seq_len * (self.tokens_per_step or 0)
        return 0.0


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
    """Launch overhead plus FLOPs at the assumed efficiency (and the optimizer's memory pass)."""
    comm_seconds: float
    """All the step's communication (intra- plus inter-node), before overlap."""
    exposed_comm_seconds: float
    """The part of `comm_seconds` that compute does not hide."""
    overhead_seconds: float
    mfu: float
    mfu_source: str = ""
    """Where `mfu` came from: measured, learned, the GPU type's published table, the default."""
    intra_busbw_gbs: float | None
    inter_busbw_gbs: float | None
    bound: Bound
    parallel: Parallel = Parallel.DDP
    recompute: str = "none"


def efficiency(workload: Workload, gpu: GpuFacts, defaults: ModelDefaults) -> tuple[float, str]:
    """(the MFU assumed on `gpu`, where it came from): learned, measured, the GPU's default."""
    if gpu.name in workload.mfu_by_gpu:
        mfu, source = workload.mfu_by_gpu[gpu.name], f"learned from earlier runs on {gpu.name}"
    elif workload.mfu is not None:
        mfu, source = workload.mfu, workload.mfu_source or "measured"
    elif gpu.efficiency:
        mfu, source = gpu.efficiency, f"{gpu.name}'s published efficiency ({gpu.efficiency_source})"
    else:
        mfu, source = defaults.mfu, "the stated default (no published table for this GPU)"
    return min(mfu, gpu.matmul_fraction), source


def compute_seconds(
    workload: Workload,
    gpu: GpuFacts,
    defaults: ModelDefaults,
    *,
    recompute: str | None = None,
    shards: int = 1,
) -> tuple[float, float, float, str]:
    """(compute seconds, launch overhead seconds, efficiency, its source) on one GPU.

    Recomputed FLOPs cost `recompute_time_share` of their count; the optimizer step reads and
    writes this GPU's share (`shards`) of the state at the GPU's memory bandwidth."""
    mfu, source = efficiency(workload, gpu, defaults)
    overhead = workload.ops_per_step * OP_SECONDS
    flops = workload.flops_per_step + defaults.recompute_time_share * workload.recompute_flops(
        recompute
    )
    bandwidth = gpu.memory_bw_tbs * 1e12
    optimizer = 2 * workload.state_bytes / shards / bandwidth
    busy = max(flops / (gpu.peak_flops() * mfu), memory_bound_seconds(workload, bandwidth))
    return overhead + busy + optimizer, overhead, mfu, source


def memory_bound_seconds(workload: Workload, bandwidth: float) -> float:
    """The forward and backward's floor in memory traffic: every weight read twice and every
    gradient written once (the whole model: FSDP gathers it), every saved activation written
    and read once, at the GPU's nominal memory bandwidth. A small batch (few tokens per weight)
    is bound by it, so an L4 or A10G is not ranked on peak FLOPs alone."""
    return (3 * workload.weight_bytes + 2 * workload.activation_bytes) / bandwidth


def allreduce_seconds(nbytes: float, ranks: int, busbw_gbs: float) -> float:
    """An all-reduce of `nbytes` over `ranks` at bus bandwidth `busbw_gbs` (nccl-tests)."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (busbw_gbs * 1e9)


def gather_seconds(nbytes: float, ranks: int, busbw_gbs: float) -> float:
    """An all-gather (or reduce-scatter) of `nbytes` in all over `ranks`: (n−1)/n · bytes / bw."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (busbw_gbs * 1e9)


def intra_node_busbw_gbs(gpu: GpuFacts, defaults: ModelDefaults) -> float:
    """All-reduce bus bandwidth among one node's GPUs: NVLink one way, else PCIe."""
    link = gpu.nvlink_gbs / 2 if gpu.nvlink_gbs else gpu.pcie_gbs
    return link * defaults.intra_node_achievable


def _sharded_exposed(ag: float, rs: float, forward: float, backward: float) -> float:
    """One micro-batch's FSDP communication not hidden: the all-gathers are on the critical
    path (the next layer waits for its parameters), the reduce-scatter trails backward."""
    return max(0.0, ag - forward) + max(0.0, ag + rs - backward)


def step_time(
    workload: Workload,
    gpu: GpuFacts,
    *,
    gpus_per_node: int,
    nodes: int,
    inter_busbw_gbs: float | None,
    defaults: ModelDefaults | None = None,
    parallel: Parallel = Parallel.DDP,
    recompute: str | None = None,
) -> StepTime:
    """The step on `nodes` × `gpus_per_node` of `gpu`, nodes joined at `inter_busbw_gbs`."""
    defaults = defaults or hardware.model()
    recompute = recompute or workload.recompute or "none"
    k, m = gpus_per_node, workload.micro_batches
    shards = {Parallel.DDP: 1, Parallel.HSDP: k, Parallel.FSDP: k * nodes}[parallel]
    compute, overhead, mfu, source = compute_seconds(
        workload, gpu, defaults, recompute=recompute, shards=shards
    )
    busy = compute - overhead
    forward = busy * workload.flops_per_step / 3 / _executed(workload, recompute, defaults) / m
    backward = busy / m - forward
    intra_bw = intra_node_busbw_gbs(gpu, defaults) if k > 1 else None
    inter_bw = inter_busbw_gbs if nodes > 1 else None
    hidden = defaults.overlap * backward
    if parallel is Parallel.DDP:
        comm = allreduce_seconds(workload.grad_bytes, k, intra_bw or 1.0)
        comm += allreduce_seconds(workload.grad_bytes, nodes, inter_bw) if inter_bw else 0.0
        exposed = max(0.0, comm - hidden)
    else:
        sharded_over_nodes = parallel is Parallel.FSDP and inter_bw is not None
        ranks = k * nodes if parallel is Parallel.FSDP else k
        bw = (inter_bw if sharded_over_nodes else intra_bw) or 1.0
        ag = gather_seconds(workload.shard_bytes, ranks, bw)
        comm = 3 * ag * m
        exposed = _sharded_exposed(ag, ag, forward, backward) * m
        if parallel is Parallel.HSDP and inter_bw:
            across = allreduce_seconds(workload.shard_bytes, nodes, inter_bw)
            comm += across
            exposed += max(0.0, across - hidden)
    if exposed > compute:
        bound = Bound.NETWORK
    else:
        bound = Bound.OVERHEAD if overhead > busy else Bound.COMPUTE
    return StepTime(
        step_seconds=compute + exposed,
        compute_seconds=compute,
        comm_seconds=comm,
        exposed_comm_seconds=exposed,
        overhead_seconds=overhead,
        mfu=mfu,
        mfu_source=source,
        intra_busbw_gbs=intra_bw,
        inter_busbw_gbs=inter_bw,
        bound=bound,
        parallel=parallel,
        recompute=recompute,
    )


def _executed(workload: Workload, recompute: str, defaults: ModelDefaults) -> float:
    """The FLOPs the step's time is made of (recomputation at its time share)."""
    share = defaults.recompute_time_share * workload.recompute_flops(recompute)
    return workload.flops_per_step + share


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


def attention_flops_per_token(layers: int, hidden: int, seq_len: int) -> float:
    """Attention's score and value matmuls, forward and backward: 12 · layers · hidden · seq."""
    return 12.0 * layers * hidden * seq_len
