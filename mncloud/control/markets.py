"""Where the controller learns whether spot capacity for all N nodes is there, per backend.

- **Local rehearsal** (`TraceMarket`): a spot trace, time-compressed. Tick `i` of the run offers
  `data[i]` spot nodes (the last value holds past the trace's end). When it drops below N under
  a running spot launch, the controller takes the launch away as a cloud would: SIGKILL to the
  last node's processes (the supervisor records a preemption), then `down`, so nothing relaunches
  until the policy says so. A spot launch cannot start while the trace offers fewer than N
  (with `--min-nodes` M, fewer than M: an elastic run trains on what is offered, `elastic.py`).
- **SkyPilot** (`ManagedJobMarket`): a cloud shows no spot capacity without asking for it, so
  the managed job is the probe. RUNNING: capacity is there. RECOVERING (preempted, SkyPilot
  looking for new VMs), or PENDING/STARTING for longer than `capacity_wait_s`: it is not. The
  pending job stays queued while the policy waits (a standing spot request, free until it
  runs). With no spot job live (on-demand, or nothing), spot counts as missing until
  `probe_after_s` after it was last seen missing; then the policy may try it again, and the
  safety net (`policy.safe`) keeps a failed try from costing the deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from mncloud.backends.base import RunState
from mncloud.deadline.policy import Mode, smaller_world_pays

if TYPE_CHECKING:
    from mncloud.backends.base import Backend, RunStatus
    from mncloud.control.state import ControlState
    from mncloud.plan.traces import Trace

#: Seconds to wait for the local supervisor to record a trace's preemption before `down`.
PREEMPTION_RECORD_S = 15.0


class Clock(Protocol):
    """Wall time and waiting, injectable so tests never wait on real time."""

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class Market(Protocol):
    """A backend's spot capacity, and how a running spot launch loses it."""

    keeps_spot_request: bool
    """Whether a spot launch that lost capacity stays queued (SkyPilot) or is gone (local)."""

    def spot_at(self, state: ControlState, tick: int, status: RunStatus | None, now: float) -> bool:
        """Whether spot capacity for all nodes is there at `tick`."""
        ...

    def lose_spot(self, name: str, backend: Backend) -> None:
        """Spot capacity went away under a running spot launch."""
        ...

    def offered(
        self, state: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> int | None:
        """How many spot nodes `tick` offers, for an elastic run (`--min-nodes`,
        `elastic.py`); None: not known, all or none as `spot_at` says."""
        ...


class TraceMarket:
    """Local "spot" nodes whose capacity follows a trace (see the module docstring)."""

    keeps_spot_request = False

    def __init__(self, trace: Trace, nodes: int, min_nodes: int | None = None) -> None:
        self.available = [bool(v) for v in trace.available(min_nodes or nodes)]
        self.counts = list(trace.data)
        self.nodes = nodes

    def offered(
        self, state: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> int | None:
        return self.counts[min(tick, len(self.counts) - 1)]

    def spot_at(self, state: ControlState, tick: int, status: RunStatus | None, now: float) -> bool:
        """Spot for all nodes; for an elastic run, for at least `--min-nodes` when training on
        them pays against waiting for all (`policy.smaller_world_pays`, on the past ticks)."""
        at = min(tick, len(self.available) - 1)
        offered = self.counts[at]
        if not self.available[at] or offered >= self.nodes:
            return self.available[at]
        return smaller_world_pays(state.config.job(), offered, self.counts[: at + 1])

    def lose_spot(self, name: str, backend: Backend) -> None:
        before = backend.status(name)
        if before.state is RunState.RUNNING:  # (a run already recovering lost its node)
            backend.take_node(name, before.nodes - 1, by="spot trace (capacity below the nodes)")

            def recorded() -> bool:
                now = backend.status(name)
                return now.preemptions > before.preemptions or now.state.is_final

            _wait_for(recorded, PREEMPTION_RECORD_S, interval=0.1)
        backend.down(name)


def _wait_for(check: Callable[[], bool], timeout: float, interval: float) -> None:
    """Call `check` every `interval` seconds until it is true or `timeout` has passed."""
    from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

    wait = Retrying(
        stop=stop_after_delay(timeout), wait=wait_fixed(interval), retry=retry_if_result(_false)
    )
    with contextlib.suppress(RetryError):
        wait(check)


def _fewer_may_fit(state: ControlState) -> bool:
    """An elastic run's spot job that found no VMs: fewer nodes may still find some."""
    min_nodes = state.config.min_nodes
    return min_nodes is not None and (state.nodes_live or state.config.nodes) > min_nodes


def _false(value: bool) -> bool:
    return not value


class ManagedJobMarket:
    """SkyPilot: capacity read off the managed job's state (see the module docstring)."""

    keeps_spot_request = True

    def spot_at(self, state: ControlState, tick: int, status: RunStatus | None, now: float) -> bool:
        cfg = state.config
        if state.market is Mode.SPOT and status is not None and not status.state.is_final:
            if status.state is RunState.RUNNING:
                return True
            if status.state is RunState.RECOVERING:  # a job group's nodes train on while
                running = "running" in status.node_states.values()  # one is replaced
                return running or _fewer_may_fit(state)
            waited = (now - (state.entered_at or now)) * cfg.time_scale
            return waited < cfg.capacity_wait_s or _fewer_may_fit(state)
        missing = state.spot_missing_since
        return missing is None or (now - missing) * cfg.time_scale >= cfg.probe_after_s

    def lose_spot(self, name: str, backend: Backend) -> None:
        """Nothing to stop: SkyPilot keeps looking for spot VMs for the job."""

    def offered(
        self, state: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> int | None:
        """A managed job shows whether its VMs came, not how many a smaller one would get, so
        an elastic run guesses: the live spot job's nodes while it runs or may yet start; one
        fewer once it waited `capacity_wait_s` for VMs or is recovering; all `--nodes` again
        once it has run `probe_after_s` on fewer (a job that does not start shrinks again)."""
        cfg = state.config
        if cfg.min_nodes is None:
            return None
        live = state.nodes_live or cfg.nodes
        if state.market is not Mode.SPOT or status is None or status.state.is_final:
            return state.nodes_offered or cfg.nodes
        in_market = (now - (state.entered_at or now)) * cfg.time_scale
        if status.state is RunState.RUNNING:
            return cfg.nodes if live < cfg.nodes and in_market >= cfg.probe_after_s else live
        if status.state is RunState.RECOVERING or in_market >= cfg.capacity_wait_s:
            return max(cfg.min_nodes, live - 1)
        return live
