"""How the controller answers a launch that ended without it: each end has one answer.

The backend's status says how the live launch ended (`RunStatus.state` and, for FAILED, its
`failure`: every SkyPilot state maps to one, `backends/skypilot/status.py`):

    SUCCEEDED              the run is finished (the deadline met or missed, the cost)
    FAILED  capacity       (FAILED_NO_RESOURCE) on spot: spot is missing from now on (probed
                           again `probe_after_s` later) and the policy decides again at once:
                           on-demand, spot in another place, or a wait. On on-demand: launched
                           again after `CAPACITY_BACKOFF` (1, 2, 4 min: SkyPilot has just
                           tried every region it may use), `MAX_RELAUNCHES` times in a row at
                           most; the wait is in the state (`relaunch_at`), a restart keeps it
    FAILED  user           (FAILED, FAILED_SETUP) launched again from the newest checkpoint,
                           counted against `--max-restarts` over the whole run (a launch the
                           controller makes retries no error itself, so each is counted once);
                           past it the run fails, with the count
    FAILED  infra          (FAILED_CONTROLLER: SkyPilot's own machinery) launched again, not
                           counted against `--max-restarts`; `MAX_RELAUNCHES` in a row at most
    FAILED  vanished       the queue no longer lists the job: unsure for `VANISHED_LOOKS` looks
                           (a queue answering from elsewhere), then as SkyPilot's own failure
    FAILED  refused        (FAILED_PRECHECKS, or the script refused its input: a checkpoint
                           another model wrote) the run fails: a retry sends the same request
    (any FAILED)           first, whatever of the launch is still live is cancelled: a job
                           group with one FAILED node keeps its other nodes training and
                           billing; a relaunch beside them would be a second gang
    CANCELLED              someone else stopped the launch (`sky jobs cancel`): the run stops;
                           the controller launches nothing more. While SkyPilot still tears
                           it down (CANCELLING, no `end_at`) the look is unsure: it bills on

Every launch made again goes through `Controller._apply`, journaled first, so a controller that
dies in between makes it once. Example, 2 nodes, a spot launch SkyPilot cannot place:

    tick 0   spot → managed spot job 7 (PENDING while SkyPilot looks for VMs)
    tick 2   job 7 FAILED_NO_RESOURCE: a `failure` event closes its record; spot is missing
             since now; the policy decides tick 2 again → ON_DEMAND: job 8, on-demand
    tick 14  spot is probed again (an hour later); job 8 runs on meanwhile
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING

from tenacity import RetryCallState, wait_exponential

from mncloud.backends.base import Failure, RunState
from mncloud.control.billing import close
from mncloud.deadline.policy import Mode

if TYPE_CHECKING:
    from mncloud.backends.base import RunStatus
    from mncloud.control.steering import Steering

log = logging.getLogger(__name__)

#: Launches made again in a row after the backend failed them (no on-demand capacity, its own
#: failure), before the run fails; a launch seen RUNNING starts the count over.
MAX_RELAUNCHES = 3
#: Looks in a row at a job the queue no longer lists before it counts as lost.
VANISHED_LOOKS = 3
CAPACITY_BACKOFF = wait_exponential(multiplier=60.0, min=60.0, max=1800.0)
"""Wall seconds before the n-th relaunch of an on-demand launch that found no capacity."""


class Settled(enum.Enum):
    """What a look at the live launch found."""

    GOING = "going"
    """Nothing ended (or nothing runs): decide as usual."""
    ENDED = "ended"
    """The run is over: the state is final."""
    AGAIN = "again"
    """The launch is over and the run goes on: decide now, this tick included."""
    UNSURE = "unsure"
    """The backend's answer cannot be trusted this look, or a relaunch waits out its backoff:
    decide nothing, look again."""


def settle(ctl: Steering, status: RunStatus | None) -> Settled:
    """Answer the live launch's status (see the module docstring)."""
    st = ctl.state
    if st.relaunch_at is not None:  # nothing runs: an on-demand relaunch waits its backoff
        if ctl.clock.time() < st.relaunch_at:
            return Settled.UNSURE
        st.relaunch_at = None
        return Settled.AGAIN
    if status is None:
        return Settled.GOING
    if not status.state.is_final:
        st.vanished_looks = 0
        if status.state is RunState.RUNNING:
            st.relaunches = 0
        return Settled.GOING
    if status.state is RunState.SUCCEEDED:
        _finished(ctl)
        return Settled.ENDED
    if status.state is RunState.CANCELLED:
        if status.times is not None and status.times.ended_at is None:
            return Settled.UNSURE  # CANCELLING: VMs torn down, billed until CANCELLED's end
        _end(ctl, "stopped", f"the launch was cancelled outside the controller: {status.detail}")
        return Settled.ENDED
    failure = status.failure or Failure.USER
    if failure is not Failure.VANISHED:
        _cancel_the_rest(ctl)
    if failure is Failure.VANISHED:
        st.vanished_looks += 1
        if st.vanished_looks < VANISHED_LOOKS:
            log.warning("%s (look %d of %d)", status.detail, st.vanished_looks, VANISHED_LOOKS)
            return Settled.UNSURE
        failure = Failure.INFRA
    st.vanished_looks = 0
    if failure is Failure.CAPACITY:
        return _no_capacity(ctl, status)
    if failure is Failure.USER:
        return _user_failed(ctl, status)
    if failure is Failure.INFRA:
        return _relaunch(ctl, status, "SkyPilot lost the launch")
    _end(ctl, "failed", f"the launch was refused (no retry mends it): {status.detail}")
    return Settled.ENDED


def _cancel_the_rest(ctl: Steering) -> None:
    """A failed launch may leave part of it live: one FAILED node of a job group, and
    SkyPilot keeps the other nodes training and billing. Cancel all of it before anything
    else (a relaunch beside it would be a second gang on the same checkpoints); a cancel
    SkyPilot cannot confirm raises, and the look is unsure (`unsure.py`)."""
    st = ctl.state
    if not ctl.backend.records_own_events:  # else the backend ends its own launch (local)
        ctl.backend.down(st.name, notice_s=0.0, by="the deadline controller (the launch failed)")


def _no_capacity(ctl: Steering, status: RunStatus) -> Settled:
    st = ctl.state
    if st.market is not Mode.SPOT:
        settled = _relaunch(ctl, status, f"no {st.market.value} capacity")
        if settled is Settled.AGAIN:  # not at once: after CAPACITY_BACKOFF
            st.relaunch_at = ctl.clock.time() + capacity_backoff_s(st.relaunches)
            return Settled.UNSURE
        return settled
    _close(ctl, status)
    ctl.course.spot_gone(st, ctl.clock.time())
    log.info("no spot capacity for the launch (%s); deciding again", status.detail)
    return Settled.AGAIN


def capacity_backoff_s(relaunch: int) -> float:
    """The wait before the `relaunch`-th on-demand relaunch for want of capacity."""
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = relaunch
    return float(CAPACITY_BACKOFF(state))


def _user_failed(ctl: Steering, status: RunStatus) -> Settled:
    st = ctl.state
    limit = int(st.spec.get("max_restarts", 0))
    if st.errors_retried >= limit:
        _end(ctl, "failed", f"an error in your code, retried {st.errors_retried} of "
                            f"--max-restarts {limit} times: {status.detail}")  # fmt: skip
        return Settled.ENDED
    st.errors_retried += 1
    _close(ctl, status)
    log.info("the launch failed (%s); launching again (%d of --max-restarts %d)",
             status.detail, st.errors_retried, limit)  # fmt: skip
    return Settled.AGAIN


def _relaunch(ctl: Steering, status: RunStatus, why: str) -> Settled:
    """A launch the backend failed: made again, `MAX_RELAUNCHES` times in a row at most."""
    st = ctl.state
    if st.relaunches >= MAX_RELAUNCHES:
        _end(ctl, "failed", f"{why} {st.relaunches + 1} times in a row: {status.detail}")
        return Settled.ENDED
    st.relaunches += 1
    _close(ctl, status)
    log.info("%s (%s); launching again (%d of %d)", why, status.detail, st.relaunches,
             MAX_RELAUNCHES)  # fmt: skip
    return Settled.AGAIN


def _close(ctl: Steering, status: RunStatus) -> None:
    """The live launch is over and the run goes on: nothing runs until the next decision."""
    st = ctl.state
    close(ctl, "failure", f"deadline controller: the launch ended: {status.detail}")
    st.market = st.mode = Mode.NONE
    st.phase = "waiting"


def _end(ctl: Steering, phase: str, detail: str) -> None:
    st = ctl.state
    st.phase, st.market, st.mode, st.detail = phase, Mode.NONE, Mode.NONE, detail
    ctl.refresh_costs()


def _finished(ctl: Steering) -> None:
    st = ctl.state
    _end(ctl, "finished", "")
    from mncloud.control.pacing import run_seconds

    end = run_seconds(st, ctl.clock.time()) / 3600
    met = "met" if end * 3600 <= st.config.deadline_s else "MISSED"
    st.work_hours = st.config.hours
    st.detail = (
        f"finished at {end:.2f} h, deadline {st.config.deadline_s / 3600:g} h {met}; "
        f"cost ${st.cost:,.2f} (spot ${st.spot_cost:,.2f}, on-demand "
        f"${st.on_demand_cost:,.2f})"
    )
    close(ctl, "finish", f"deadline controller: {st.detail}")
