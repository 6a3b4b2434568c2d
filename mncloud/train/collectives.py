"""The checkpoint's own gloo groups, and the ranks' agreements on them.

A `CheckpointManager` never runs a collective on the training process group. It makes its own
gloo groups (every rank in the same order): `agree_pg` for the small agreements on the training
thread at step boundaries (staged? uploaded? a notice?), `dcp_pg` for DCP's planning on the
upload worker, and, when watching for preemption, `emergency_pg` for an emergency save's DCP
beside a periodic one. Without torch.distributed every agreement is this process's own value.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class Collectives:
    """This process's rank and the checkpoint's gloo groups; agreements on `agree_pg`."""

    def __init__(self, timeout_s: float, *, emergency: bool) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.agree_pg: Any = None
        self.dcp_pg: Any = None
        self.emergency_pg: Any = None
        """DCP of an emergency save, beside a periodic one (None unless `emergency`)."""
        if self.distributed:
            timeout = timedelta(seconds=timeout_s)
            self.agree_pg = dist.new_group(backend="gloo", timeout=timeout)
            self.dcp_pg = dist.new_group(backend="gloo", timeout=timeout)
            if emergency:  # every rank has the same environment: same groups
                self.emergency_pg = dist.new_group(backend="gloo", timeout=timeout)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, by rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.agree_pg)
        return out

    def all_sum(self, *values: int) -> list[int]:
        """Each value summed over the ranks."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.agree_pg)
        return [int(v) for v in t.tolist()]

    def all_min(self, value: float) -> float:
        """The least of every rank's `value`."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.agree_pg)
        return float(t.item())

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.agree_pg)
        return box[0]

    def barrier(self) -> None:
        """Wait for every rank (a no-op in one process)."""
        if self.distributed:
            dist.barrier(group=self.agree_pg)
