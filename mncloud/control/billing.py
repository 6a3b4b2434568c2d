"""The ledger bills what SkyPilot runs: each look, the live launch's record follows the times
SkyPilot's queue reports for its job (`records.ledger.catch_up`).

A cloud spot job waits for VMs (PENDING, STARTING), runs, is preempted (RECOVERING: no VMs),
runs again when SkyPilot's own recovery gets VMs, ends. Only the running is billed, from the
queue's own times (`last_recovered_at`, `job_duration`, `end_at`), not from when the
controller happened to look:

    t=0      launch (spot, $40/h)     `launch`, closed at once by `waiting`: nothing runs
    t=0.3h   RUNNING since 0.25 h     `running` at 0.25 h
    t=1.3h   RECOVERING, ran 1 h      `preemption` at 1.25 h                  $40
    t=1.6h   RUNNING since 1.5 h      `running` at 1.5 h
    t=2.1h   looked at                                                  $40 + $24 so far
    (CANCELLING bills on while SkyPilot tears the VMs down; CANCELLED closes at its `end_at`)

One end event per launch: the queue's (`finish`/`failure` at SkyPilot's `end_at`), or where the
queue gave none, the controller's (`close`, which asks the queue first). A launch no controller
looks at again is ended at SkyPilot's end from the bucket's copy of its record, its job found by
run id (`close_open`): one an earlier controller left open (it died, or `--replace` ended it) by
the next controller's looks (`close_earlier`), and every one `mncloud down` cancelled, from the
laptop too (`close_downed`).

A job group's status gives its node tasks' times as one job's (`skypilot/group.group_times`).
A status without the queue's times (the local backend) keeps the older way:
`preemption` when the controller counts the spot gone, `recovery` (`reopen`) when it runs again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from mncloud.backends.base import RunState
from mncloud.deadline.policy import Mode
from mncloud.errors import MncloudError

if TYPE_CHECKING:
    from mncloud.backends.base import Backend, ControllerHost, RunStatus
    from mncloud.control.state import ControlState
    from mncloud.control.steering import Course, Steering
    from mncloud.records.ledger import CostSummary
    from mncloud.records.model import Event

log = logging.getLogger(__name__)

PLACEMENT = ("cloud", "region", "instance_type", "spot", "hourly_price")
_DETAILS = {
    "waiting": "SkyPilot: the job waits for VMs (nothing billed)",
    "running": "SkyPilot: the job's VMs run it",
    "preemption": "SkyPilot: the spot VMs were preempted (RECOVERING)",
}


def follow(ctl: Steering, status: RunStatus | None) -> bool:
    """Bring the live launch's record up to what the queue says ran (and the records an
    earlier controller left open, `close_earlier`); whether it could (the status has the
    queue's times and the launch has a record)."""
    st, backend = ctl.state, ctl.backend
    if st.earlier_run_ids and not backend.runs_here and not backend.records_own_events:
        close_earlier(st, backend.controller_host(), ctl.clock.time())
    if status is None or status.times is None or backend.records_own_events:
        return False
    return follow_queue(st, status, ctl.clock.time())


def follow_queue(
    st: ControlState, status: RunStatus | None, now: float, run_id: str | None = None
) -> bool:
    """`follow` of run `st`'s live launch (or its launch `run_id`) without a controller
    (`close_downed`, `close_earlier`)."""
    from mncloud.records.ledger import catch_up
    from mncloud.records.store import append_event, find_record

    if status is None or status.times is None:
        return False
    if run_id is None and not st.run_ids:
        return False
    run_id = run_id or st.run_ids[-1]
    try:
        record = find_record(run_id)
    except MncloudError:
        return False
    end_kind = "failure" if status.state is RunState.FAILED else "finish"
    spot = status.spot if status.spot is not None else st.market is Mode.SPOT
    placement = _placement(record.events)
    for kind, at in catch_up(record, status.times, now, spot=spot, end_kind=end_kind):
        extra = placement if kind == "running" else {}
        detail = _DETAILS.get(kind, f"SkyPilot: {status.detail}")
        append_event(st.name, kind, detail=detail, at=at, run_id=run_id, **extra)  # type: ignore[arg-type]
    return True


def close_earlier(st: ControlState, host: ControllerHost, now: float) -> None:
    """The records of the launches of the controllers before this one (`earlier_run_ids`,
    `lease.py`) still open here, each followed to SkyPilot's end of its job as that
    controller's next look would have (none comes: it died, or `--replace` ended it) and
    written back to the bucket: no copy of the run's records bills a job that ended. One
    not ended yet (still being cancelled), or SkyPilot unsure now: again at the next look."""
    close_open(st, host, st.earlier_run_ids, now)


def close_open(
    st: ControlState, host: ControllerHost, run_ids: list[str], now: float | None,
    *, fetch: bool = False,
) -> float | None:  # fmt: skip
    """Each of `run_ids` whose record (here, or with `fetch` the bucket's copy, kept here) is
    open, followed to what SkyPilot's queue says of its job (found by run id; `now` None:
    only a job that ended, up to its end) and written back; the latest end followed."""
    from mncloud.constants import RUN_ID_ENV
    from mncloud.control.identity import fetch_record_of
    from mncloud.records.store import find_record

    latest = None
    for run_id in run_ids:
        try:
            record = find_record(run_id)  # (`identity.restore` fetched the bucket's copy)
        except MncloudError:
            record = fetch_record_of(st, run_id) if fetch else None
        if record is None or record.finished or not any(e.kind == "launch" for e in record.events):
            continue
        spot = bool(_placement(record.events).get("spot"))
        try:
            jobs = host.jobs_with_env(st.name, RUN_ID_ENV, [run_id])
            status = host.job_status(jobs[-1], st.name, st.config.nodes, spot) if jobs else None
        except MncloudError as err:
            log.info("the record of launch %s stays open for now: %s", run_id, err)
            continue
        ended = status.times.ended_at if status is not None and status.times else None
        upto = now if now is not None else ended
        if upto is None or not follow_queue(st, status, upto, run_id):
            continue
        latest = max(latest or upto, upto)
        if ended is not None and status is not None:  # (a stint unseen ends in `waiting`)
            with contextlib.suppress(MncloudError):  # unreadable now: the next look's, or none
                _ended(st.name, run_id, status, ended)
    return latest


def _ended(name: str, run_id: str, status: RunStatus, ended: float) -> None:
    """Launch `run_id`'s end event at SkyPilot's `ended`, unless its record has one."""
    from mncloud.records.store import append_event, find_record

    if not find_record(run_id).finished:
        kind = "failure" if status.state is RunState.FAILED else "finish"
        append_event(name, kind, detail=f"SkyPilot: {status.detail}", at=ended, run_id=run_id)


def close(ctl: Steering, kind: str, detail: str) -> None:
    """The live launch's `finish`/`failure` in its record, once: none when the queue's end
    (`follow`, at SkyPilot's `end_at`) closed it already, nor when the backend records its own
    end (local)."""
    from mncloud.records.store import find_record

    st = ctl.state
    if ctl.backend.records_own_events:
        return
    if st.run_ids:
        with contextlib.suppress(MncloudError):  # SkyPilot unsure now: the end is this look's
            # the queue's end first: a take-down's cancel ended at SkyPilot's `end_at`, which
            # may be before this look (a cancel that outlasted `WAIT_S`, finished later)
            follow_queue(st, live_status(ctl.backend, st), ctl.clock.time())
        with contextlib.suppress(MncloudError):  # unreadable now: the end is written anyway
            if find_record(st.run_ids[-1]).finished:
                return
    ctl.event(kind, detail)


def live_status(backend: Backend, st: ControlState) -> RunStatus | None:
    """The backend's status of run `st`'s newest launch, where this machine holds that
    launch's record of the engine (None: another launch's, or none)."""
    meta = backend.controller_host().launch_meta(st.name)
    if not st.run_ids or meta is None or meta.get("run_id") != st.run_ids[-1]:
        return None
    return backend.status(st.name)


def close_downed(st: ControlState) -> None:
    """After `mncloud down` cancelled run `st`'s jobs: each launch's record still open closed
    at SkyPilot's `end_at`, as the controller's next look would have (`follow`; none comes
    now), and the cost kept in the state (`launch_costs`, what the laptop's `status` shows):
    from this machine's copy of the record or, where it has none (a laptop), the bucket's,
    its job found by run id (`close_open`). SkyPilot or the bucket unreadable now: as the
    controller left it."""
    from mncloud.backends.registry import get_backend

    backend = get_backend(st.config.backend)
    if backend.records_own_events or backend.runs_here:
        return
    run_ids = [*st.earlier_run_ids, *st.run_ids]
    ended = close_open(st, backend.controller_host(), run_ids, None, fetch=True)
    if ended is not None:
        count_costs(st, ended)


def _placement(events: list[Event]) -> dict[str, object]:
    launch = next((e for e in reversed(events) if e.kind == "launch"), None)
    return {} if launch is None else {k: getattr(launch, k) for k in PLACEMENT}


def reopen(ctl: Steering) -> None:
    """The live spot job got VMs again after the controller counted it preempted, and its
    status has no queue times (see the module docstring): a `recovery` event priced as its
    launch."""
    from mncloud.records.store import append_event, find_record

    st = ctl.state
    if ctl.backend.records_own_events or not st.run_ids:  # the backend records it (local)
        return
    try:
        events = find_record(st.run_ids[-1]).events
    except MncloudError:
        return
    if not any(e.kind == "launch" for e in events):
        return
    append_event(
        st.name,
        "recovery",
        detail="deadline controller: SkyPilot got the spot job VMs again",
        at=ctl.clock.time(),
        **_placement(events),  # type: ignore[arg-type]
    )


def refresh_costs(st: ControlState, course: Course, now: float) -> None:
    """Spot and on-demand cost so far (`count_costs`); the course keeps what it needs beyond
    (across places: each place's)."""
    course.account(st, count_costs(st, now))


def count_costs(st: ControlState, now: float) -> dict[str, CostSummary]:
    """Spot and on-demand cost so far (`st.spot_cost`, `st.on_demand_cost`): the ledgers of
    every launch's run record, each kept in the state too (`st.launch_costs`), so a record
    this home lacks (a controller restarted on a fresh VM) counts as last read; each
    launch's summary, by run id."""
    from mncloud.records.ledger import CostSummary, cost_summary
    from mncloud.records.store import find_record

    costs: dict[str, CostSummary] = {}
    for run_id in st.run_ids:
        try:
            summary = cost_summary(find_record(run_id), now=now)
        except MncloudError:  # not on this home (a fresh VM), or unreadable now: as last read
            spot, on_demand = st.launch_costs.get(run_id, (0.0, 0.0))
            summary = CostSummary(
                run_id=run_id, segments=[], total=spot + on_demand, spot=spot,
                on_demand=on_demand, unpriced_hours=0.0, preemptions=0, restarts=0,
                estimate=None, estimate_hourly=None,
            )  # fmt: skip
        st.launch_costs[run_id] = (summary.spot, summary.on_demand)
        costs[run_id] = summary
    st.spot_cost = sum(c.spot for c in costs.values())
    st.on_demand_cost = sum(c.on_demand for c in costs.values())
    return costs
