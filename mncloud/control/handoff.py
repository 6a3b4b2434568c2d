"""A cloud controller hands the run to a fresh controller job before its token expires.

SkyPilot gives each controller job a token of the launching user valid 3 days, never renewed
(`horizon.py`). Where it does (`ControlConfig.hands_off`: service accounts on, a new enough
server), the controller launches its successor through the path `up` uses (`start.launch_sky`,
`templates/control.yaml.j2`, `api_server_access: true`): a job of the same user, so SkyPilot
gives it a fresh token of that user. The successor is named by a random key, journaled in
the state (`successor`) before its launch and given to it as `MNCLOUD_HANDOFF_KEY`; the state
says which key holds the run (`controller_key`; "" for the controller `up` launched):

    h 0      up --deadline 100h --hours 90: job 1 (key ""), its token until h 72
    h 65     72 h − TOKEN_MARGIN_S − HANDOFF_MARGIN_S: job 1 journals key k1, launches job 5
             (fresh token until h 137) and steers on; job 5 starts, reads the state: held
             by "", so it waits, deciding nothing, reading the state again every look
    h 65.1   job 1's look: job 5 is RUNNING → `controller_key` k1, `controller_job_id` 5,
             saved to the bucket (a journal write: unsaved, nothing is handed); job 1 exits 0
    h 65.2   job 5's look: the run is its own → it adopts the live training job as a
             restarted controller would (`recovery.recover`: nothing is cancelled) and steers
    h 130    job 5 hands off to job 9 the same way; and so on

One controller decides at a time: the holder until it writes the hand-off, the successor
only once it reads it. In between (one look of the successor) nobody decides, and the
training job trains on. A successor whose holder's job is over without handing off (it died
past its restarts) takes the run itself. A controller whose key no longer holds the run (a
late restart of the old one, a successor the holder gave up on) exits 0, touching nothing.

A successor that fails to launch is launched again `RETRY_S` later; one that ends before it
runs is given up. Until the run is handed, the holder's stop point stays (`horizon.token_stop`,
`TOKEN_MARGIN_S` before its expiry): the run is stopped at a checkpoint, the reason naming
the hand-off that did not come (`missed`), and a successor not yet running is cancelled.
The hand-off waits while a launch or take-down of the training job is journaled
(`launching`, `closing`, a look cut short by an error): it is finished first.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Protocol

from mncloud.control.access import TOKEN_MARGIN_S
from mncloud.control.steering import Steering
from mncloud.errors import MncloudError

log = logging.getLogger(__name__)

HANDOFF_ENV = "MNCLOUD_HANDOFF_KEY"
"""The successor's key: its task's plain env (a name for the job, no credential)."""
HANDOFF_MARGIN_S = 6 * 3600.0
"""How long before its stop point the controller launches its successor: its CPU VM's
provisioning and setup take minutes, a queue for on-demand CPUs or an API server that is
down for a while take longer; 6 h leaves room for `RETRY_S` retries of a failed launch."""
RETRY_S = 3600.0
"""After a successor's launch failed, the next try."""
POLL_S = 30.0
"""A successor waiting for the run reads its state this often (wall seconds)."""


class Handing(Steering, Protocol):
    """The controller as this module sees it."""

    token_ends: float | None
    stop_reason: str | None
    handoff_key: str
    """This controller's key (`own_key`)."""
    succeeded: bool
    """The run is not (or no longer) this controller's: it ends, exit 0."""


def own_key() -> str:
    """This controller's hand-off key ("": the controller `up` launched)."""
    return os.environ.get(HANDOFF_ENV, "")


def steers(ctl: Handing) -> bool:
    """Whether this controller holds the run now. A successor not yet handed it reads the
    state again (and takes the run once handed, or once its holder's job is over); one whose
    key does not hold it and never will sets `ctl.succeeded` (it ends, exit 0)."""
    st, key = ctl.state, ctl.handoff_key
    if st.controller_key == key:
        return True
    nxt = st.successor
    if not key or nxt is None or nxt.key != key or nxt.failed or st.final:
        ctl.succeeded = True  # handed away, or a successor given up on
        return False
    return _waited(ctl)


def _waited(ctl: Handing) -> bool:
    """A successor's look while it waits: the state read again; True once the run is its."""
    from mncloud.control.recovery import recover
    from mncloud.control.state import load_uri, save_state

    st = ctl.state
    fresh = load_uri(st.config.state_uri or "")
    if fresh is None:
        return False  # unreadable now: the next look reads it again
    for name in type(st).model_fields:
        setattr(st, name, getattr(fresh, name))
    if st.controller_key != ctl.handoff_key:
        if st.final or st.successor is None or st.successor.key != ctl.handoff_key:
            ctl.succeeded = True
            return False
        if st.successor.failed or _holder_live(ctl):
            ctl.succeeded = bool(st.successor.failed)
            return False
        log.warning("controller job %s is over without handing the run off: taking it",
                    st.controller_job_id)  # fmt: skip
        _hand(ctl, save=False)
        save_state(st)
    log.info("the run is handed to this controller (key %s): adopting it", ctl.handoff_key)
    recover(ctl)  # what the last holder launched is adopted, never cancelled
    return True


def _holder_live(ctl: Handing) -> bool:
    """Whether the job holding the run is live (unknown, or a job id never recorded: yes)."""
    from mncloud.control.lease import live_controllers

    holder = ctl.state.controller_job_id
    try:
        return holder is None or holder in live_controllers(
            ctl.backend.controller_host(), ctl.state.name
        )
    except MncloudError:
        return True


def hand(ctl: Handing) -> None:
    """The holder's part, each look: launch the successor when due, and hand it the run
    once its job runs (`ctl.succeeded`: this controller then ends)."""
    st = ctl.state
    ends, now = ctl.token_ends, ctl.clock.time()
    if not st.config.hands_off or ends is None or ctl.stop_reason is not None or st.final:
        return
    if now >= ends - TOKEN_MARGIN_S:  # the stop point: the run is stopped (`token_stop`), its
        _give_up(ctl)  # successor cancelled even where the journal is finished first
        return
    if st.launching is not None or st.closing is not None:
        return  # the journal is finished first
    if now < ends - TOKEN_MARGIN_S - HANDOFF_MARGIN_S:
        return
    nxt = st.successor
    if nxt is None or nxt.key == st.controller_key or (nxt.failed and now >= nxt.at + RETRY_S):
        _launch(ctl)
        return
    if nxt.failed:
        return
    try:
        state = _successor_state(ctl)
    except MncloudError as err:
        log.warning("the successor controller's job is unknown this look: %s", err)
        return
    if state == "RUNNING":
        _hand(ctl, save=True)
    elif state != "live":
        nxt.failed = f"controller job {nxt.job_id} ended {state} before it ran"
        log.warning("hand-off: %s", nxt.failed)


def _successor_state(ctl: Handing) -> str:
    """The successor's job: "RUNNING", "live" (not yet), else how it ended ("none": not
    made); its job id found by its key when a crash came between its launch and the save."""
    st = ctl.state
    nxt = st.successor
    assert nxt is not None
    host = ctl.backend.controller_host()
    if nxt.job_id is None:
        host.launches_in_flight(f"{st.name}-control", wait=True)
        found = host.jobs_with_env(f"{st.name}-control", HANDOFF_ENV, [nxt.key])
        nxt.job_id = found[-1].job_id if found else None
        if nxt.job_id is None:
            nxt.failed = "its launch was not made"
            return "none"
    job = host.job_states([nxt.job_id]).get(nxt.job_id)
    if job is None:
        return "none"
    if job.statuses and job.statuses[0] == "RUNNING":
        return "RUNNING"
    return "live" if job.live else (job.statuses or ["none"])[0]


def _launch(ctl: Handing) -> None:
    """Journal a successor (its key), then launch it; a failure is kept (`RETRY_S`)."""
    from mncloud.control.start import launch_sky
    from mncloud.control.state import Successor, save_state

    st = ctl.state
    st.successor = Successor(key=secrets.token_hex(8), at=ctl.clock.time())
    try:
        save_state(st, journal=True)  # in the bucket before the launch is sent
        st.successor.job_id = launch_sky(st, {HANDOFF_ENV: st.successor.key})
    except MncloudError as err:
        st.successor.failed = f"its launch failed: {err}"
        log.warning("hand-off: the successor controller %s", st.successor.failed)
    else:
        log.info("hand-off: successor controller job %s launched", st.successor.job_id)
    save_state(st)


def _give_up(ctl: Handing) -> None:
    """At the stop point, a successor not yet handed the run is cancelled (had it started, it
    would find the run stopped and exit): no `NAME-control` outlives the stop."""
    st = ctl.state
    nxt = st.successor
    if nxt is None or nxt.key == st.controller_key or nxt.failed:
        return
    nxt.failed = f"controller job {nxt.job_id} had not started by the stop point"
    if nxt.job_id is not None:
        try:
            ctl.backend.controller_host().cancel([nxt.job_id])
        except MncloudError as err:  # it exits by itself once it starts: the run is stopped
            log.warning("hand-off: the successor job %s not cancelled: %s", nxt.job_id, err)


def _hand(ctl: Handing, *, save: bool) -> None:
    """The run to the successor: the state names its key and job (`save`: a journal write;
    unsaved, the run stays with this controller)."""
    from mncloud.control.state import save_state

    st, now = ctl.state, ctl.clock.time()
    nxt = st.successor
    assert nxt is not None
    before = (st.controller_key, st.controller_job_id, st.controller)
    hours = (now - (st.started_at or now)) / 3600
    nxt.handed_at = now
    st.controller_key, st.controller_job_id = nxt.key, nxt.job_id
    st.controller = (
        f"SkyPilot managed job {nxt.job_id} ({st.name}-control); the controller handed off "
        f"at h {hours:.0f} from job {before[1]}"
    )
    if not save:
        return
    try:
        save_state(st, journal=True)
    except MncloudError as err:
        nxt.handed_at = None
        st.controller_key, st.controller_job_id, st.controller = before
        log.warning("hand-off not written (%s): this controller steers on", err)
        return
    log.info("hand-off: the run is now steered by controller job %s", nxt.job_id)
    ctl.succeeded = True


def missed(ctl: Handing) -> str:
    """Why no fresh controller took the run over, for the stop's reason."""
    st = ctl.state
    if not st.config.hands_off:
        return "SkyPilot gives no controller job a token of its own here"
    nxt = st.successor
    if nxt is None or nxt.key == st.controller_key:
        return "no fresh controller job was launched in time"
    if nxt.failed:
        return f"the hand-off to a fresh controller job failed ({nxt.failed})"
    return f"the fresh controller job {nxt.job_id} had not started"


def wait_turn(ctl: Handing) -> bool:
    """Wait (a look every `POLL_S`) until the run is this controller's; False when it never
    will be (`ctl.succeeded`)."""
    while not steers(ctl):
        if ctl.succeeded:
            return False
        ctl.clock.sleep(POLL_S)
    return True
