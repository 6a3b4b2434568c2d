"""The cost ledger: billed segments read off a run's events, and spot hazards learned from them.

A backend appends events (`store.append_event`); segments of billed time are read off them
(`cost_segments`). An example sequence for a 2-node spot job:

    launch      t=0     aws p5.48xlarge spot $40/h   ─┐ segment 1: 2.0 h × $40 = $80
    checkpoint  t=1.5h  step 3000                      │
    preemption  t=2h    node 1                        ─┘
    recovery    t=2.2h  gcp a3-highgpu-8g spot $45/h ─┐ segment 2: open, priced until now
    finish      t=5h                                  ─┘           (or its end): 2.8 h × $45

`launch`, `recovery` (relaunch after a preemption) and `restart` (relaunch after an error) open
a segment at the event's `hourly_price` (the whole job's $/h), and so do node recovery's
`node-lost` (the survivors' price) and `node-joined` (the replacement started: all N again);
`preemption`, `failure` and `finish` close it; a new opening event also closes an open one.
The gap between a preemption and the recovery is not billed: a managed job tears the cluster
down and provisions a new one, and the provisioning time is what SkyPilot bills least
predictably — a backend that knows better sends its `recovery` event when provisioning starts.

A scheduler that reports when its VMs ran the job (SkyPilot's managed-jobs queue: `start_at`,
`last_recovered_at`, `job_duration`, `end_at`) is followed exactly (`catch_up`): the `launch`
segment closes at once (`waiting`: the job is queued for VMs, nothing billed), each stint of
running opens at its start (`running`, at `last_recovered_at`) and closes where the run seconds
say it ended (`preemption` for a spot job gone RECOVERING, `waiting` otherwise, the end's kind
when it ended). A spot job that waits 20 min, runs 1 h, is preempted, recovers 10 min later
and runs 30 min more bills 1.5 h, not 2 h.

`observed_spot_hazard` turns the ledgers of this machine's records into preemptions per
node-hour by cloud, for the planner's `--learn`.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from mncloud.records.model import CLOSES_SEGMENT, OPENS_SEGMENT, PREEMPTIONS, Event, RunRecord
from mncloud.records.store import list_records


class Segment(BaseModel):
    """A stretch of billed time: from a launch/recovery/restart to its end."""

    index: int
    start: float
    end: float
    open: bool
    """Still running: `end` is now."""
    ended_by: str | None
    opened_by: str
    cloud: str | None
    region: str | None
    instance_type: str | None
    spot: bool | None
    hourly_price: float | None
    hours: float
    cost: float | None
    """None when the price is unknown."""


class RunTimes(BaseModel):
    """When the job's VMs ran it, as its scheduler reports it (SkyPilot's queue)."""

    running: bool
    """VMs hold the job now (RUNNING, WINDING_DOWN, CANCELLING while they are torn down)."""
    ran_s: float
    """Seconds they ran it so far, waiting and recovery excluded (`job_duration`)."""
    since: float | None
    """When the current (or last) stint began (`last_recovered_at`); None: it never ran."""
    ended_at: float | None = None
    """When the job ended (`end_at`); None while it (or its teardown) goes on."""
    recovering: bool = False
    """Preempted (or failed) and waiting for VMs again (RECOVERING)."""


#: Seconds within which two times of one stint count as the same instant.
SAME_S = 1e-3


def catch_up(
    record: RunRecord, times: RunTimes, now: float, *, spot: bool, end_kind: str = "finish"
) -> list[tuple[str, float]]:
    """The events (kind, time) that make `record`'s ledger bill what `times` reports (see the
    module docstring): a stint opened once at its start, closed where its run seconds end."""
    segments = cost_segments(record, now)
    opened = segments[-1] if segments and segments[-1].open else None
    closed_s = sum((s.end - s.start) for s in segments if not s.open)
    seen = times.since is not None and any(s.start >= times.since - SAME_S for s in segments)
    added: list[tuple[str, float]] = []
    if times.running and times.since is not None:
        if seen:
            return added  # this stint is billed (or was, before a teardown of its VMs)
        before = times.ran_s - ((times.ended_at or now) - times.since)
        if opened is not None:  # the wait before it, or a stint that ended unseen
            end = opened.start + max(0.0, before - closed_s)
            added.append(("waiting", min(max(end, opened.start), times.since)))
        elif before - closed_s > SAME_S:  # a whole stint ran between two looks
            added += _unseen(before - closed_s, times.since - (before - closed_s))
        added.append(("running", times.since))
        return added
    ran_s = times.ran_s if times.since is not None else 0.0
    if opened is not None and times.ended_at is not None and times.ended_at < opened.start:
        # Ended before its launch was recorded (a launch adopted after a crash): closed where
        # it opened, never left open; what it ran before, where the run seconds put it.
        extra = max(0.0, ran_s - closed_s)
        unseen = _unseen(extra, times.ended_at - extra) if extra > SAME_S else []
        return [*unseen, (end_kind, opened.start)]
    if opened is None:
        extra = max(0.0, ran_s - closed_s)
        if times.since is not None and not seen and (extra > SAME_S or times.recovering):
            # A stint seen recovering is marked even when it ran 0 s: SkyPilot's `job_duration`
            # of a job cancelled (or failed) from RECOVERING counts the wait since it began
            # (`sky/jobs/utils.py`), and CANCELLING reads as VMs held; it is not billed again.
            added += _unseen(extra, min(times.since, (times.ended_at or now) - extra))
        return added
    end = min(max(opened.start + ran_s - closed_s, opened.start), times.ended_at or now)
    if times.ended_at is not None:
        kind = end_kind
    else:
        kind = "preemption" if spot and times.recovering and ran_s > 0 else "waiting"
    added.append((kind, end))
    return added


def _unseen(seconds: float, start: float) -> list[tuple[str, float]]:
    """A stint of `seconds` that started and ended between two looks, from `start` (how long
    it ran the queue says; when, only of its last stint)."""
    return [("running", start), ("waiting", start + seconds)]


class CostSummary(BaseModel):
    """A run's cost so far by segment and market, against the plan's estimate."""

    run_id: str
    segments: list[Segment]
    total: float
    spot: float
    on_demand: float
    unpriced_hours: float
    """Hours in segments without a known price (not in the totals)."""
    preemptions: int
    restarts: int
    estimate: float | None
    """The plan's expected cost of the whole job."""
    estimate_hourly: float | None


def cost_segments(record: RunRecord, now: float | None = None) -> list[Segment]:
    """The run's billed segments (see the module docstring), the open one priced until now."""
    now = time.time() if now is None else now
    segments: list[Segment] = []
    opened: Event | None = None

    def close(end: float, by: str | None, is_open: bool) -> None:
        assert opened is not None
        hours = max(0.0, end - opened.time) / 3600.0
        price = opened.hourly_price
        segments.append(
            Segment(
                index=len(segments) + 1,
                start=opened.time,
                end=end,
                open=is_open,
                ended_by=by,
                opened_by=opened.kind,
                cloud=opened.cloud,
                region=opened.region,
                instance_type=opened.instance_type,
                spot=opened.spot,
                hourly_price=price,
                hours=hours,
                cost=None if price is None else price * hours,
            )
        )

    for event in sorted(record.events, key=lambda e: e.time):
        if event.kind in OPENS_SEGMENT:
            if opened is not None:
                close(event.time, event.kind, False)
            opened = event
        elif event.kind in CLOSES_SEGMENT and opened is not None:
            close(event.time, event.kind, False)
            opened = None
    if opened is not None:
        close(max(now, opened.time), None, True)
    return segments


def cost_summary(record: RunRecord, now: float | None = None) -> CostSummary:
    """Cost so far, split by segment and by spot vs on-demand, against the plan's estimate."""
    segments = cost_segments(record, now)
    spot = sum(s.cost or 0.0 for s in segments if s.spot)
    on_demand = sum(s.cost or 0.0 for s in segments if not s.spot)
    choice = (record.plan or {}).get("choice") or {}
    return CostSummary(
        run_id=record.run_id,
        segments=segments,
        total=spot + on_demand,
        spot=spot,
        on_demand=on_demand,
        unpriced_hours=sum(s.hours for s in segments if s.cost is None),
        preemptions=sum(e.kind in PREEMPTIONS for e in record.events),
        restarts=sum(e.kind in ("recovery", "restart") for e in record.events),
        estimate=record.estimate,
        estimate_hourly=choice.get("hourly_total"),
    )


def observed_spot_hazard(
    records: list[RunRecord] | None = None, min_node_hours: float = 1.0
) -> dict[str, tuple[float, int, float]]:
    """Observed spot preemptions per node-hour by cloud: `cloud → (hazard, count, node_hours)`.

    Feeds the planner's `--learn`: a preemption counts against the spot segment it ended, if
    that segment ran (a job that waited for capacity and never ran lost nothing). Clouds
    with fewer than `min_node_hours` of spot time are left out (too little to learn from).
    """
    records = list_records() if records is None else records
    totals: dict[str, list[float]] = {}
    for record in records:
        for seg in cost_segments(record):
            if not seg.spot or not seg.cloud:
                continue
            entry = totals.setdefault(seg.cloud, [0.0, 0.0])
            entry[0] += seg.ended_by in PREEMPTIONS and seg.hours > 0  # it ran, then lost VMs
            entry[1] += seg.hours * record.nodes
    return {
        cloud: (count / hours, int(count), hours)
        for cloud, (count, hours) in totals.items()
        if hours >= min_node_hours and hours > 0
    }


class ObservedRun(BaseModel):
    """What an earlier cloud run measured on the offer its plan chose (for `plan --learn`)."""

    script: str
    args: list[str]
    cloud: str
    instance_type: str
    accelerator: str
    """Per node, e.g. `H100:8`."""
    nodes: int
    step_seconds: float | None
    """The median over ranks of their newest mean seconds per step."""
    busbw_gbs: float | None
    """The preflight's all-reduce bus bandwidth between nodes (one rank per node)."""
    created_at: float


def observed_runs(records: list[RunRecord] | None = None) -> list[ObservedRun]:
    """Step times and bandwidths earlier cloud runs measured, newest first. A local run's
    figures describe this machine, not an offer, and are left out: it has no plan (no
    instance type chosen)."""
    records = list_records() if records is None else records
    found: list[ObservedRun] = []
    for record in records:
        choice = (record.plan or {}).get("choice") or {}
        if not choice.get("instance_type"):
            continue
        times = sorted(record.step_times.values())
        step = times[len(times) // 2] if times else None
        busbw = (record.bandwidth or {}).get("busbw_gbs")
        if step is None and busbw is None:
            continue
        found.append(
            ObservedRun(
                script=str(record.spec.get("script", "")),
                args=[str(a) for a in record.spec.get("script_args", [])],
                cloud=str(choice.get("cloud", "")),
                instance_type=str(choice["instance_type"]),
                accelerator=str(choice.get("accelerator", "")),
                nodes=record.nodes,
                step_seconds=step,
                busbw_gbs=float(busbw) if busbw else None,
                created_at=record.created_at,
            )
        )
    return sorted(found, key=lambda o: o.created_at, reverse=True)
