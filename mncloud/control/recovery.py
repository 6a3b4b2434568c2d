"""Resuming a deadline controller that died: finish the action its state journaled, once.

The controller writes an action on the run into its state before it starts it and clears it
once it is done (`ControlState.closing`, `ControlState.launching`). A controller started on a
state with one set (its keeper restarted it, `mncloud status` or `up --resume` did, or
SkyPilot restarted its managed job) finishes it before it decides anything:

    closing     the live launch was being taken down: `down` again (idempotent)
    launching   a decision's launch was under way. Made already (a run record of the name
                from the launch's start on, not yet in the state, whose launch got as far as
                its supervisor, or whose backend knows the run): adopted, its `launch`
                event written only if the record lacks it. Not made, or cut short before its
                supervisor started: what it left is marked over and the launch is made again.

A controller that took the run from another (`up --resume`, `--replace`) first makes sure no
launch of that one is live (`earlier_launches`: its jobs cancelled, `control/lease.py`).

On a cloud the controller may be restarted on a fresh VM, its state from the bucket and its
MNCLOUD_HOME empty: first what the state knows of its launches is written back there
(`identity.restore`), and a journaled launch is looked for in SkyPilot's queue by the run id
journaled with it (`identity.find`), never by the run's name.

Example: `kill -9` during a switch from spot to on-demand, after the spot launch went down
and while the on-demand one was being launched; the keeper restarts the controller, which
finds `launching` (on-demand, tick 9) and a record made since, whose supervisor runs: it
adopts it. The ledger has two launches, one per decision; the tick is not decided again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from mncloud.control.billing import close
from mncloud.control.state import Launching, save_state
from mncloud.control.steering import LaunchMade
from mncloud.deadline.policy import Mode
from mncloud.errors import MncloudError, RunNotFoundError

if TYPE_CHECKING:
    from mncloud.control.steering import Steering

log = logging.getLogger(__name__)


class LaunchUnknown(MncloudError):
    """Whether a journaled launch was made cannot be told now (SkyPilot did not answer): the
    controller neither launches nor gives up; it exits non-zero and SkyPilot restarts it."""


def recover(ctl: Steering) -> None:
    """Finish what the controller before `ctl` left half done (see the module docstring)."""
    from mncloud.control.identity import restore

    st = ctl.state
    restored = restore(st)
    if restored:
        log.info("resuming where the run's files were missing: %s written back from the state",
                 "; ".join(restored))  # fmt: skip
    earlier_launches(ctl)
    if st.closing is not None:
        log.info("resuming: the launch was being taken down (%s); again", st.closing)
        ctl.down(0.0 if st.mode is Mode.NONE else ctl.stop_notice_s())
        close(ctl, "finish", f"deadline controller: {st.closing}")  # unless SkyPilot's end did
        st.market, st.closing = Mode.NONE, None
        save_state(st)
    pending = st.launching
    if pending is None:
        return
    found = launch_made(ctl, pending)
    if found is not None:
        run_id, record = found
        log.info("resuming: the launch of tick %d was made (%s); adopted", pending.tick, run_id)
        choice = ((record.plan if record is not None else None) or {}).get("choice") or {}
        placement = {k: choice.get(k) for k in ("cloud", "region", "instance_type")}
        placement["hourly_price"] = choice.get("hourly_total")
        ckpt_uri = record.ckpt_uri if record is not None else None
        made = LaunchMade(pending.mode, pending.tick, pending.reason, run_id, ckpt_uri, placement)
        ctl.launched(made)
    else:
        log.info("resuming: the launch of tick %d was not made; launching", pending.tick)
        if st.market is not Mode.NONE:
            ctl.take_down(f"switching to {pending.mode.value}: {pending.reason}")
        _clear_half_launch(ctl)
        ctl.launch(pending.mode, pending.tick, pending.reason, again=True)
    ctl.decided(pending.decision)
    save_state(st)


def earlier_launches(ctl: Steering) -> None:
    """The jobs of the controllers before this one (`earlier_run_ids`, which `up` found ended,
    `lease.py`): one their launch made after `up` looked (a request `up` could not see, such
    as another API user's) is cancelled before this controller launches anything.
    LaunchUnknown when SkyPilot cannot say: SkyPilot restarts the controller, which asks again."""
    from mncloud.control.lease import LAUNCH_POLL_S, LAUNCH_WAIT_S, live_jobs

    st = ctl.state
    if not st.earlier_run_ids or ctl.backend.runs_here:
        return
    host = ctl.backend.controller_host()
    try:
        flying = host.settle_launches(
            st.earlier_run_ids, wait_s=LAUNCH_WAIT_S, poll_s=LAUNCH_POLL_S, sleep=ctl.clock.sleep
        )
        if flying:
            raise LaunchUnknown(f"launch request(s) {', '.join(flying)} still in flight")
        live = live_jobs(host, st.name, st.earlier_run_ids)
        if live:
            log.warning("job(s) %s of an earlier controller's launch live: cancelled", live)
            host.cancel(live)
    except MncloudError as err:
        raise LaunchUnknown(
            f"cannot tell whether a launch of the controller before this one is live: {err}"
        ) from None


def launch_made(ctl: Steering, pending: Launching) -> tuple[str, Any] | None:
    """The run id and record of the launch `pending` made before a crash, or None. A cloud
    launch is looked for in SkyPilot's queue by its journaled run id (`identity.find`)."""
    from mncloud.records.store import list_records

    st = ctl.state
    if not ctl.backend.runs_here and pending.run_id is not None:
        from mncloud.control.identity import find

        try:
            return find(st, pending)
        except MncloudError as err:
            raise LaunchUnknown(
                f"cannot tell whether launch {pending.run_id} was made: {err}"
            ) from None
    fresh = [
        r for r in list_records(st.name)
        if r.created_at >= pending.at - 1.0 and r.run_id not in st.run_ids
    ]  # fmt: skip
    if not fresh:
        return None
    record = fresh[-1]
    try:
        ctl.backend.status(st.name)
    except RunNotFoundError:
        return None
    if not ctl.backend.launch_took(st.name, record.run_id):
        return None
    return record.run_id, record


def _clear_half_launch(ctl: Steering) -> None:
    """A launch cut short (a record, a run folder, no supervisor): mark it over."""
    try:
        status = ctl.backend.status(ctl.state.name)
    except RunNotFoundError:
        return
    if not status.state.is_final:
        ctl.backend.down(ctl.state.name)


def has_launch_event(run_id: str | None) -> bool:
    """Whether the record `run_id` already has the controller's `launch` event."""
    from mncloud.records.store import find_record

    if not run_id:
        return False
    try:
        record = find_record(run_id)
    except MncloudError:
        return False
    return any(
        e.kind == "launch" and e.detail.startswith("deadline controller") for e in record.events
    )
