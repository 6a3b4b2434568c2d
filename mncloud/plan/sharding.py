"""Which parallelism and recomputation a replica needs on an offer, and its memory per GPU.

`--parallel auto` (the default, `None` here) takes the first that fits one GPU's usable memory
(its capacity × `memory_headroom`):

1. **DDP** when a whole replica fits: weights, gradients, optimizer state and activations;
2. **HSDP** (more than one node) when the state sharded over one node's k GPUs fits: only the
   gradient all-reduce crosses the network;
3. **FSDP** over every GPU of the run (N·k) otherwise.

Within each, recomputation as little as fits (`--recompute` fixes it): none, then full.
(Selective recomputation, of the attention core, saves the a·s² scores that flash attention
does not keep anyway: it fits where none fits, so `auto` does not pick it.)

Memory per GPU = state / shards + activations + (sharded) two layers' gathered bf16
parameters. Activations from flags follow Korthikanti et al. 2022 (https://arxiv.org/abs/
2205.05198, Table 2) with flash attention (no a·s² term): 34 bytes × hidden per token per
layer kept for backward; full recomputation keeps each layer's 2-byte input (2 × hidden) plus
one layer's 34 × hidden while it recomputes. A profile's measured activations stand as they are.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from mncloud.plan import hardware
from mncloud.plan.stepmodel import GIB, SHARD_BYTES_PER_PARAM, Workload
from mncloud.spec import Parallel

#: Bytes per token per layer per unit of width kept for backward (Korthikanti et al., Table 2).
ACTIVATION_BYTES = 34
#: With full recomputation: each layer's input, bf16.
CHECKPOINT_BYTES = 2
#: `auto`'s order of recomputation, least first.
RECOMPUTE_ORDER = ("none", "full")


class Layout(NamedTuple):
    """How a replica is laid out on an offer's GPUs, and why."""

    parallel: Parallel
    recompute: str
    memory_bytes: float
    """Per GPU."""
    why: str


def activation_bytes(workload: Workload, recompute: str) -> float:
    """Activations one GPU keeps for backward of one micro-batch under `recompute`."""
    w = workload
    if not (w.layers and w.hidden and w.tokens_per_step):
        return w.activation_bytes  # measured (a profile) or unknown (0)
    tokens = w.tokens_per_step / w.micro_batches
    if recompute == "full":
        return (
            CHECKPOINT_BYTES * w.hidden * w.layers * tokens + ACTIVATION_BYTES * w.hidden * tokens
        )
    return ACTIVATION_BYTES * w.hidden * w.layers * tokens


def memory_per_gpu(
    workload: Workload, parallel: Parallel, recompute: str, *, gpus_per_node: int, nodes: int
) -> float:
    """Bytes one GPU holds: its share of the state, activations, gathered parameters."""
    shards = {Parallel.DDP: 1, Parallel.HSDP: gpus_per_node}.get(parallel, gpus_per_node * nodes)
    gathered = 0.0
    if parallel is not Parallel.DDP and workload.layers:
        gathered = 2 * SHARD_BYTES_PER_PARAM * workload.param_count / workload.layers
    return workload.state_bytes / shards + activation_bytes(workload, recompute) + gathered


def _candidates(
    asked: Parallel | None, recompute: str | None, nodes: int
) -> list[tuple[Parallel, str]]:
    kinds = [asked] if asked else [Parallel.DDP, Parallel.HSDP, Parallel.FSDP]
    if nodes == 1 and asked is None:
        kinds.remove(Parallel.HSDP)  # on one node HSDP is FSDP
    modes = [recompute] if recompute else list(RECOMPUTE_ORDER)
    return [(kind, mode) for kind in kinds for mode in modes]


def choose(
    workload: Workload,
    memory_gib: float,
    *,
    gpus_per_node: int,
    nodes: int,
    asked: Parallel | None = None,
) -> Layout | None:
    """The first layout that fits (module docstring), or None: none fits this offer."""
    usable = memory_gib * GIB * hardware.model().memory_headroom
    for parallel, recompute in _candidates(asked, workload.recompute, nodes):
        need = memory_per_gpu(
            workload, parallel, recompute, gpus_per_node=gpus_per_node, nodes=nodes
        )
        if need <= usable:
            return Layout(parallel, recompute, need, _why(parallel, asked, nodes, gpus_per_node))
    return None


def _why(parallel: Parallel, asked: Parallel | None, nodes: int, k: int) -> str:
    if asked is not None:
        return f"--parallel {asked.value}"
    if parallel is Parallel.DDP:
        return "a replica fits one GPU"
    if parallel is Parallel.HSDP:
        return f"the state sharded over one node's {k} GPUs fits; only gradients cross nodes"
    if nodes == 1:
        return f"a replica does not fit one GPU: sharded over the node's {k} GPUs"
    return f"it fits only sharded over all {nodes * k} GPUs"


def gpus_needed(workload: Workload, memory_gib: float) -> int | None:
    """How many GPUs of `memory_gib` a fully sharded run with full recomputation needs, or
    None when even one GPU's activations and gathered layers do not fit."""
    usable = memory_gib * GIB * hardware.model().memory_headroom
    fixed = memory_per_gpu(
        workload.model_copy(update={"weight_bytes": 0, "grad_bytes": 0, "optimizer_bytes": 0}),
        Parallel.FSDP,
        workload.recompute or "full",
        gpus_per_node=1,
        nodes=1,
    )
    if fixed >= usable:
        return None
    return max(1, math.ceil(workload.state_bytes / (usable - fixed)))
