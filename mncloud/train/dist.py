"""Process-group set-up from torchrun's environment, per-rank seeding, rank helpers.

Works the same in a plain single process (no torchrun): rank 0 of a world of 1, nothing to
initialise. `wrap_ddp` builds a DistributedDataParallel whose gradient reduction does not depend
on its bucket layout, so a resumed run stays bitwise-identical to one that never stopped.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from mncloud import constants
from mncloud.constants import CPU_THREADS_ENV


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job."""

    rank: int
    world_size: int
    local_rank: int
    distributed: bool
    """True when a process group is initialised."""


def _launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_distributed(*, backend: str | None = None, timeout_s: float = 600.0) -> DistInfo:
    """Initialise the default process group from torchrun's variables, if there are any.

    `backend` defaults to nccl with CUDA, else gloo. `timeout_s` bounds every collective, so a
    peer that vanished without a connection reset (a preempted VM) is noticed in minutes, not
    after torch's default 30. Without torchrun this does nothing and returns rank 0 of 1.
    """
    if dist.is_available() and dist.is_initialized():
        return info()
    if not _launched_by_torchrun() or not dist.is_available():
        return info()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return info()


def info() -> DistInfo:
    """The rank, world size and local rank of this process."""
    on = dist.is_available() and dist.is_initialized()
    return DistInfo(
        rank=dist.get_rank() if on else 0,
        world_size=dist.get_world_size() if on else 1,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")) if on else 0,
        distributed=on,
    )


def data_shard() -> tuple[int, int]:
    """(this rank's data shard, the number of shards): its global rank and the world size,
    or, under node recovery (each node its own process group), node × ranks per node + rank
    and nodes × ranks per node, so every rank of the run reads a shard of its own."""
    d = info()
    if os.environ.get(constants.RECOVERY_ENV) != "node":
        return d.rank, d.world_size
    replica = int(os.environ.get(constants.REPLICA_ID_ENV, "0"))
    replicas = int(os.environ.get(constants.NUM_REPLICAS_ENV, "1"))
    return replica * d.world_size + d.rank, replicas * d.world_size


def get_rank() -> int:
    """This process's global rank (0 without a process group)."""
    return info().rank


def get_world_size() -> int:
    """The number of processes (1 without a process group)."""
    return info().world_size


def is_main() -> bool:
    """True on rank 0 (and in a single process)."""
    return get_rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if info().distributed:
        dist.barrier()


def cleanup() -> None:
    """Destroy the default process group, if one exists."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(
    seed: int,
    *,
    per_rank: bool = True,
    deterministic: bool = True,
    threads: int | None = None,
) -> int:
    """Seed python, numpy and torch (CPU and CUDA); return the seed used on this rank.

    `per_rank` adds the rank to the seed (distinct dropout masks and augmentations per rank).
    `deterministic` turns on `torch.use_deterministic_algorithms` (and the cuBLAS workspace
    setting it needs). `threads` fixes torch's intra-op thread count (default: the
    MNCLOUD_CPU_THREADS variable, if set), because a different count can change float sums.
    """
    s = seed + (get_rank() if per_rank else 0)
    random.seed(s)
    try:
        import numpy as np

        np.random.seed(s % 2**32)
    except ImportError:
        pass
    torch.manual_seed(s)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(s)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        if torch.backends.cudnn.is_available():
            torch.backends.cudnn.benchmark = False
    if threads is None and os.environ.get(CPU_THREADS_ENV):
        threads = int(os.environ[CPU_THREADS_ENV])
    if threads:
        torch.set_num_threads(threads)
    return s


_ONE_BYTE_MB = 1 / 2**20
"""One byte, in the MiB that DDP's bucket caps are given in."""


def wrap_ddp(model: torch.nn.Module, *, exact: bool = True, **ddp_kwargs: Any) -> torch.nn.Module:
    """Wrap a model in DistributedDataParallel (or return it as is without a process group).

    With `exact` (the default), every parameter gets its own gradient bucket. Plain `DDP(model)`
    reduces the first step in one bucket and then rebuilds its buckets from the order gradients
    became ready, so the first step after a resume (initial layout) reduces gradients in a
    different layout than the uninterrupted run (rebuilt layout); with more than two ranks the
    sums then differ in their last bits. One parameter per bucket makes the layout irrelevant:
    each all-reduce covers one parameter, whatever the order. (`find_unused_parameters=True`
    also keeps the layout, but costs a graph traversal per step and makes DDP print a
    performance warning on every rank.) The price is one all-reduce per parameter tensor; pass
    `exact=False`, or your own `bucket_cap_mb`, to bucket normally. On CUDA, `device_ids`
    defaults to the local rank.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "device_ids" not in ddp_kwargs and next(model.parameters()).is_cuda:
        ddp_kwargs["device_ids"] = [info().local_rank]
    bucketing = {"bucket_cap_mb", "bucket_cap_mb_list", "find_unused_parameters"}
    if not exact or bucketing & ddp_kwargs.keys():
        return DDP(model, **ddp_kwargs)
    # A 1-byte cap closes every bucket after one parameter. (A 0 cap also does on torch 2.13,
    # but torch 2.11 rejects a falsy cap: "bucket_cap_mb should be set by now".)
    return DDP(model, bucket_cap_mb_list=[_ONE_BYTE_MB], **ddp_kwargs)
