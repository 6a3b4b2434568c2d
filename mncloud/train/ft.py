"""Node recovery: each node a replica group; survivors keep stepping while one node is replaced.

    replicas = Replicas(state)                # node mode when the run says so, else a pass-through
    ddp = wrap_ddp(model)                     # DDP over this node's ranks (node mode) or all ranks
    ckpt = CheckpointManager(interval_steps=50, replicas=replicas)
    start = ckpt.load(state) or 0
    for step, (x, y) in replicas.steps(loader, start=start, total=1000):
        loss = loss_fn(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if not replicas.step(opt):            # a peer was lost: this batch comes again
            continue
        ckpt.maybe_save(step, state)          # one replica saves; the others skip

`mncloud up --recovery node` (or a script that uses `Replicas`) starts one torchrun per node
with `MNCLOUD_RECOVERY=node`, a lighthouse (torchft's quorum server) the nodes reach through
`TORCHFT_LIGHTHOUSE`, and each node's replica number. Without those variables every method is
the plain loop above (gang recovery: the whole run restarts from the bucket).

Design (torchft's Manager underneath): every step starts with a quorum at the lighthouse. The
gradients, already averaged over the node's ranks by DDP, are averaged across the replicas in
the quorum (rank i of each node with rank i of the others, one flat all-reduce), and the
optimizer steps only if every replica's all-reduce succeeded. A sharded model
(`parallelize(..., default="fsdp")`, FSDP2 over the node's own ranks) works the same way:
FSDP reduce-scatters the gradients inside the node, and rank i of each node averages its
local shards (`DTensor.to_local()`), which are the same slice of the same parameters on every
node (torchtitan's HSDP under torchft, with the cross-node average after the backward pass
instead of in FSDP's all-reduce hook). Example, 3 nodes:

    step 40   quorum {0, 1, 2}; all three commit
    step 41   node 1 is preempted mid all-reduce: nodes 0 and 2 see the error, do not commit
    step 41   quorum {0, 2} once node 1 stops heartbeating (seconds); the same batch again,
              averaged over two replicas; training goes on (node 1's data shard waits)
    step 90   node 1's replacement starts, loads the bucket's newest step (say 50), asks for a
              quorum: {0, 1, 2} at step 90 > 50, so it heals: model, optimizer, data position
              and step stream from node 0 over HTTP; it applies them only once whole
    step 91   all three step together again; their weights are the same bits

A replacement that cannot heal (its peer gone mid-transfer) does not commit and heals again at
the next quorum. When fewer than half the nodes are left, no quorum commits (the local
supervisor then relaunches the whole gang from the bucket; on a cloud the survivors wait for
their replacements). Bucket checkpoints keep running, written by the quorum's first replica.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from collections.abc import Iterable, Iterator, MutableMapping
from datetime import timedelta
from typing import Any

import torch

from mncloud import constants
from mncloud.constants import min_replicas
from mncloud.errors import MncloudError
from mncloud.train import profiler
from mncloud.train.steptime import event as record_event

log = logging.getLogger(__name__)

QUORUM_TIMEOUT_S = 1800.0
"""How long a step waits for a quorum: a replacement's provisioning fits in it."""
CONFIGURE_TIMEOUT_S = 15.0
"""How long making a quorum's group waits for a peer's store and connections. A peer that dies
in the middle of it (a replacement lost right after it joined) costs the survivors this, not
the collective timeout; a live peer connects in well under a second."""


_CONFIGURE_ARGS = ("store_addr", "replica_id", "rank", "world_size", "quorum_id", "group_rank",
                   "group_world_size", "global_ranks")  # fmt: skip


class _NoFlightRecorderNews(logging.Filter):
    """torchft warns at every quorum that NCCL's flight recorder cannot be reset (on CPU, or
    without NCCL): true and useless."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "flight recorder" not in record.getMessage()


_NO_FLIGHT_RECORDER_NEWS = _NoFlightRecorderNews()


def _quiet_torchft() -> None:
    """torchft's per-step logs off: its Rust side's info lines and its empty per-step records
    (quorum, commit and error loggers); warnings and errors stay."""
    os.environ.setdefault("RUST_LOG", "warn")
    for name in ("torchft_commits", "torchft_quorums", "torchft_errors"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("torchft").setLevel(logging.WARNING)
    # A logger's filter sees only its own records: the warning is logged by torchft.manager.
    # One shared instance, so a second Replicas adds nothing (addFilter skips a present one).
    logging.getLogger("torchft.manager").addFilter(_NO_FLIGHT_RECORDER_NEWS)


def node_recovery() -> bool:
    """True when the run asks for node recovery (`MNCLOUD_RECOVERY=node`)."""
    return os.environ.get(constants.RECOVERY_ENV, "") == "node"


def quorum_group(members: list[int], *, timeout: timedelta, configure_timeout: timedelta) -> Any:
    """torchft's reconfigurable group (NCCL on GPUs, else Gloo) that learns each quorum's nodes
    into `members` and gives a peer `configure_timeout` to show up while it is being made."""
    from torchft import ProcessGroupGloo, ProcessGroupNCCL

    base = ProcessGroupNCCL if torch.cuda.is_available() else ProcessGroupGloo

    class _Group(base):  # type: ignore[misc,valid-type]
        def configure(self, *args: Any, **kwargs: Any) -> None:
            # (store_addr, replica_id, rank, world_size, quorum_id, group_rank,
            #  group_world_size, global_ranks): global rank = node × group size + rank.
            named = dict(zip(_CONFIGURE_ARGS, args, strict=False)) | kwargs
            size = named.get("group_world_size") or 1
            members[:] = sorted({r // size for r in named.get("global_ranks") or []})
            collective, self._timeout = self._timeout, configure_timeout
            try:
                super().configure(*args, **kwargs)
            finally:
                self._timeout = collective
            _set_collective_timeout(self._pg, collective)

    return _Group(timeout=timeout)


def _set_collective_timeout(pg: Any, timeout: timedelta) -> None:
    """Gloo keeps the timeout it was made with for its collectives: give it back theirs."""
    with contextlib.suppress(AttributeError, RuntimeError):
        pg._get_backend(torch.device("cpu"))._set_default_timeout(timeout)


def _local_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients this rank holds, in the optimizer's order: under FSDP2 each a DTensor's
    local shard (`to_local()`, the same storage), so rank i of every node averages the same
    shard of the same parameters (every node shards alike: the same ranks per node)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    return [g.to_local() if isinstance(g, DTensor) else g for g in grads]


def _state_of(value: Any) -> Any:
    return value.state_dict() if hasattr(value, "state_dict") else value


class Replicas:
    """The fault-tolerant loop of one node's ranks (see the module docstring).

    `state` is the dict given to `CheckpointManager`: what a healing replica receives (model,
    optimizer, sampler position, plain values). `timeout_s` bounds a cross-node all-reduce and
    a heal; making a quorum's group, `configure_timeout_s`; a quorum waits up to
    `QUORUM_TIMEOUT_S`.
    """

    def __init__(
        self,
        state: MutableMapping[str, Any],
        *,
        timeout_s: float = 60.0,
        configure_timeout_s: float = CONFIGURE_TIMEOUT_S,
    ) -> None:
        self.state = state
        self.enabled = node_recovery()
        self.timeout_s = timeout_s
        self.configure_timeout_s = configure_timeout_s
        self.replica = int(os.environ.get(constants.REPLICA_ID_ENV, "0"))
        self.num_replicas = int(os.environ.get(constants.NUM_REPLICAS_ENV, "1"))
        self._manager: Any = None
        self._group: Any = None
        self._committed_extras: dict[str, Any] | None = None
        self._quorum: tuple[int, ...] = ()
        self._members: list[int] = []
        """The node numbers in the current quorum (set when the quorum's group is made)."""
        self.committed_step = 0
        """The newest step every replica of the quorum committed (after `steps` ends: the last)."""
        self._committed = False
        self.heals = 0
        self.retries = 0
        """Steps this replica tried and did not commit (a peer lost mid-step)."""

    # ------------------------------------------------------------------ the loop
    def steps(self, loader: Iterable[Any], *, start: int, total: int) -> Iterator[tuple[int, Any]]:
        """Yield (step number, batch) until `total` steps are committed, from `start`.

        A batch whose step did not commit comes again; after a heal the data continues from the
        healer's position. Epochs follow the loader's sampler.
        """
        self.committed_step = start
        if not self.enabled:
            yield from self._plain_steps(loader, total)
            return
        self._start(start)
        step, held, batches = start, None, None
        while step < total:
            if self._quorum_and_heal():
                step, held, batches = self._manager.current_step(), None, None
                self.committed_step = step
                if step >= total:
                    break
            if held is None:
                self._committed_extras = self._extras()
                if batches is None:
                    batches = iter(loader)
                try:
                    held = next(batches)
                except StopIteration:  # an epoch ended: the sampler moved to the next one
                    batches = iter(loader)
                    held = next(batches)
            self._committed = False
            self._profile_step(step + 1, held)
            yield step + 1, held
            if self._committed:
                step, held = step + 1, None
                self.committed_step = step

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Average the gradients over the replicas and step `optimizer` if every replica
        could; False when this batch must be tried again."""
        if not self.enabled:
            optimizer.step()
            self._profile_done()
            return True
        grads = _local_grads(optimizer)
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(1)
        self._manager.allreduce(flat).wait()
        if self._manager.errored() is not None:
            # A peer is gone. Close this replica's connections now: a survivor still blocked
            # on them fails at once and joins the next quorum, instead of waiting out the
            # collective timeout while this one waits for it there (the next quorum, new
            # after a failed commit, makes a fresh group).
            self._group.abort()
        if not self._manager.should_commit():
            self.retries += 1
            self._report(event="retry", step=self._manager.current_step() + 1)
            return False
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        optimizer.step()
        self._committed = True
        self._profile_done()
        return True

    @property
    def saves(self) -> bool:
        """True where bucket checkpoints are written: everywhere in gang mode, on the quorum's
        first replica in node mode (the others hold the same bits)."""
        if not self.enabled or self._manager is None:
            return True
        return self._manager.participating_rank() == 0

    @property
    def reports(self) -> bool:
        """True on the one rank of this replica that reports progress (its rank 0)."""
        return int(os.environ.get("RANK", "0")) == 0  # node recovery: RANK counts in the node

    def close(self) -> None:
        """Stop the replica's servers (the checkpoint server, the manager's)."""
        if self._manager is not None:
            self._manager.shutdown(wait=False)
            self._manager = None

    def _profile_step(self, step: int, batch: Any) -> None:
        """`mncloud profile`: a step starts (no cost outside a profile)."""
        if (session := profiler.session()) is not None:
            session.step_started(step, self.state, batch)

    def _profile_done(self) -> None:
        if (session := profiler.session()) is not None:
            session.step_done(self.state)

    def _plain_steps(self, loader: Iterable[Any], total: int) -> Iterator[tuple[int, Any]]:
        """Gang mode: the loader's batches, epoch after epoch, numbered on from the start."""
        empty = 0
        while self.committed_step < total:
            before = self.committed_step
            for batch in loader:
                self.committed_step += 1
                self._profile_step(self.committed_step, batch)
                yield self.committed_step, batch
                if self.committed_step >= total:
                    return
            # One empty pass is a resume at the very end of an epoch (the sampler moves on to
            # the next one); two in a row is a loader with nothing in it.
            empty = empty + 1 if self.committed_step == before else 0
            if empty >= 2:
                raise MncloudError("the data loader gave no batch for a whole epoch")

    # ------------------------------------------------------------------ torchft
    def _start(self, step: int) -> None:
        """Create the Manager (only now: a replica heartbeats once it can step)."""
        _quiet_torchft()
        try:
            from torchft import Manager
            from torchft.checkpointing import HTTPTransport
        except ImportError as err:
            raise MncloudError(
                f"--recovery node needs torchft ({err}); pip install 'mncloud[train]'"
            ) from None
        timeout = timedelta(seconds=self.timeout_s)
        host = os.environ.get(constants.REPLICA_HOST_ENV) or "127.0.0.1"

        class _Transport(HTTPTransport):  # type: ignore[misc]
            def address(self) -> str:  # peers reach us by our node's address, not hostname
                port = self._server.socket.getsockname()[1]
                return f"http://{host}:{port}/checkpoint/"

        self._group = quorum_group(
            self._members, timeout=timeout,
            configure_timeout=timedelta(seconds=self.configure_timeout_s),
        )  # fmt: skip
        self._manager = Manager(
            pg=self._group,
            load_state_dict=self._load_healed,
            state_dict=self._heal_payload,
            min_replica_size=min_replicas(self.num_replicas),
            use_async_quorum=False,  # heal before the forward pass: simple and exact
            timeout=timeout,
            quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S),
            connect_timeout=timeout,
            replica_id=f"node{self.replica}",
            hostname=host,
            checkpoint_transport=_Transport(timeout=timeout, num_chunks=0),
            init_sync=False,  # every replica starts from the same seed or the same checkpoint
        )
        self._manager.load_state_dict({"step": step, "batches_committed": 0})
        self._report(event="join", step=step)

    def _quorum_and_heal(self) -> bool:
        """Start this step's quorum (healing first if behind); True when this replica healed."""
        before = self._manager.current_step()
        t0 = time.monotonic()
        self._manager.start_quorum()
        quorum = tuple(self._members)
        if quorum != self._quorum:
            self._quorum = quorum
            self._report(event="quorum", step=before, replicas=list(quorum))
        after = self._manager.current_step()
        if after == before:
            return False
        self.heals += 1
        self._report(event="heal", step=after, from_step=before,
                     seconds=round(time.monotonic() - t0, 3))  # fmt: skip
        log.warning("replica %d healed from a live peer: step %d -> %d", self.replica, before,
                    after)  # fmt: skip
        return True

    def _extras(self) -> dict[str, Any]:
        """The non-tensor state (sampler position, plain values) as of the last commit."""
        return {
            k: copy.deepcopy(_state_of(v))
            for k, v in self.state.items()
            if not isinstance(v, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor))
        }

    def _heal_payload(self) -> dict[str, Any]:
        """What a healing peer receives: tensors by state dict, the rest as last committed."""
        tensors = {
            k: v.state_dict()
            for k, v in self.state.items()
            if isinstance(v, (torch.nn.Module, torch.optim.Optimizer))
        }
        return {"tensors": tensors, "extras": self._committed_extras or self._extras()}

    def _load_healed(self, payload: dict[str, Any]) -> None:
        for key, value in {**payload["tensors"], **payload["extras"]}.items():
            target = self.state.get(key)
            if hasattr(target, "load_state_dict"):
                target.load_state_dict(value)
            else:
                self.state[key] = value

    def _report(self, *, event: str, **record: Any) -> None:
        """One event of this replica in the run's telemetry segments (the local backend's
        node states), from its rank 0."""
        if self.reports:
            record_event(event, node=self.replica, **record)
