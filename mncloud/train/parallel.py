"""Sharded models (FSDP2 / HSDP) from one choice, and the global batch kept on any world size.

    d = init_distributed()
    model = parallelize(model, blocks=model.blocks, default="fsdp")  # or "ddp", "hsdp"
    accum = accumulation_steps(global_batch=64, micro_batch=4)       # for this world size

The choice is the script's `default` unless the run names one (`mncloud up --parallel`, which
sets `$MNCLOUD_PARALLEL`). `ddp` wraps the model in DDP (`wrap_ddp`); `fsdp` applies FSDP2's
`fully_shard` to each block, then at the root, over a 1-D mesh of every rank (ZeRO-3); `hsdp`
uses a 2-D mesh, `(nodes, ranks per node)` named `("replicate", "shard")`: sharded inside a
node, replicated across nodes, so only gradients cross the network. Scripts that call
`fully_shard` themselves work unchanged; `CheckpointManager` saves their DTensor state the
same way (each rank writes its own shard; DCP reshards it on load to any world size or mesh).

Under node recovery (`--recovery node`) each node is its own process group: `fsdp` and `hsdp`
both shard inside the node, and `Replicas` averages across nodes (see `ft.py`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from mncloud import constants
from mncloud.errors import MncloudError
from mncloud.train import profiler
from mncloud.train.dist import data_shard, info, wrap_ddp

MODES = ("ddp", "fsdp", "hsdp")
"""The values `$MNCLOUD_PARALLEL` (and `up --parallel`) take."""

_mesh_facts: dict[str, Any] = {}
"""What `parallelize` built, for the checkpoint manifest (`mesh_facts`)."""


class ParallelError(MncloudError):
    """A parallel layout that cannot be built on this world (one line for the user)."""


def parallel_mode(default: str = "ddp") -> str:
    """The run's choice (`$MNCLOUD_PARALLEL`), else `default`; ParallelError for another value."""
    mode = (os.environ.get(constants.PARALLEL_ENV) or default).strip().lower()
    if mode not in MODES:
        raise ParallelError(f"{constants.PARALLEL_ENV}={mode!r} is not one of {', '.join(MODES)}")
    return mode


def ranks_per_node() -> int:
    """Processes on this node (torchrun's `LOCAL_WORLD_SIZE`; the world size without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or info().world_size)


def mesh_shape(mode: str, world_size: int, per_node: int) -> tuple[int, ...]:
    """The device mesh's shape for `mode`: `(world,)` for fsdp, `(nodes, per_node)` for hsdp;
    ParallelError when hsdp has one node or the world is not whole nodes."""
    if mode != "hsdp":
        return (world_size,)
    if per_node < 1 or world_size % per_node:
        raise ParallelError(f"hsdp needs whole nodes: {world_size} ranks, {per_node} per node")
    nodes = world_size // per_node
    if nodes < 2:
        raise ParallelError("hsdp needs 2 or more nodes (it replicates across nodes); use fsdp")
    return (nodes, per_node)


def device_mesh(mode: str) -> Any:
    """The device mesh for `mode` over this process group (FSDP: 1-D; HSDP: 2-D, named)."""
    from torch.distributed.device_mesh import init_device_mesh

    d = info()
    if os.environ.get(constants.RECOVERY_ENV) == "node":  # a node is a group; ft.py averages
        shape: tuple[int, ...] = (d.world_size,)
    else:
        shape = mesh_shape(mode, d.world_size, ranks_per_node())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
    return init_device_mesh(device, shape, mesh_dim_names=names)


def parallelize(
    model: nn.Module,
    *,
    blocks: Any = (),
    default: str = "ddp",
    mixed_precision: bool | None = None,
    **ddp_kwargs: Any,
) -> nn.Module:
    """Spread `model` over the ranks as the run chose (see the module docstring); return the
    module to call (DDP's wrapper, or the model itself, sharded in place).

    `blocks` are the submodules sharded one by one before the root (a transformer's layers), so
    only one block's parameters are gathered at a time. `mixed_precision` (default: on CUDA)
    computes in bf16 and reduces gradients in fp32; the optimizer steps the fp32 shards.
    Without a process group the model comes back as it is.
    """
    mode = parallel_mode(default)
    d = info()
    if not d.distributed:
        if (session := profiler.session()) is not None:  # `mncloud profile`: how it shards
            session.parallel = mode
        return model
    if mode == "ddp":
        _mesh_facts.clear()
        _mesh_facts.update(parallel="ddp", shape=[d.world_size], dims=["replicate"])
        return wrap_ddp(model, **ddp_kwargs)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = device_mesh(mode)
    if mixed_precision is None:
        mixed_precision = torch.cuda.is_available()
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    _mesh_facts.clear()
    _mesh_facts.update(
        parallel=mode, shape=list(mesh.mesh.shape), dims=list(mesh.mesh_dim_names or ())
    )
    return model


def mesh_facts() -> dict[str, Any]:
    """The layout `parallelize` built in this process (parallel, shape, dims); {} if none."""
    return dict(_mesh_facts)


def accumulation_steps(global_batch: int, micro_batch: int) -> int:
    """Micro-batches per optimizer step on this world, so every step trains `global_batch`
    samples whatever the number of ranks; ParallelError when it does not divide evenly."""
    _, shards = data_shard()
    per_step = micro_batch * shards
    if global_batch < per_step or global_batch % per_step:
        raise ParallelError(
            f"global batch {global_batch} is not a whole number of micro-batches of "
            f"{micro_batch} on {shards} ranks; pick a global batch that is a multiple of "
            f"{per_step}"
        )
    return global_batch // per_step
