"""A cloud run's billed time in its run record: the events the goodput ledger prices.

A managed job's VMs bill while they run it: the record follows the times SkyPilot's queue
reports (`follow_times`, `records.ledger.catch_up`), so waiting for VMs is not billed and a
recovery SkyPilot made by itself bills from its own start. This backend writes:

    launch    when SkyPilot accepted the job: the plan's placement and $/h (all nodes)
    waiting   the job is queued for VMs (at once after the launch: nothing runs yet)
    running   its VMs run it: at SkyPilot's `last_recovered_at` (its start, each recovery)
    preemption / waiting   a spot job / any job gone RECOVERING, where its run seconds end
    finish    when `status` first sees the job SUCCEEDED or CANCELLED (at SkyPilot's end time:
              a CANCELLING job bills on until its VMs are gone)
    failure   when it first sees it FAILED (a job group with tasks still running: once SkyPilot
              ended them too); a `--cluster` run ends at `down` (or its autodown): an idle
              cluster bills on after its job

A deadline controller's launches record their own events (`control/loop.py`): the launch
request says so (`LaunchRequest.record_events`), and the run's meta remembers it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.skypilot.meta import CLUSTER, RunMeta, load_meta, save_meta

if TYPE_CHECKING:
    from mncloud.records.model import RunRecord

log = logging.getLogger(__name__)


def record_launch(meta: RunMeta) -> None:
    """The run's `launch` event, priced from the plan (`meta`)."""
    from mncloud.records.store import append_event

    what = f"cluster {meta.name}" if meta.kind == CLUSTER else f"managed job {meta.job_id}"
    append_event(
        meta.name, "launch", cloud=meta.cloud, region=meta.region,
        instance_type=meta.instance_type, spot=meta.spot, hourly_price=meta.hourly_total,
        detail=f"SkyPilot: {what}", at=meta.launched_at, run_id=meta.run_id,
    )  # fmt: skip


def record_end(meta: RunMeta, status: RunStatus) -> None:
    """The run's `finish` or `failure`, once, when its job is seen ended (a `--cluster`
    run's: when its cluster is gone or torn down); sets `meta.end_recorded` (saved by the
    caller)."""
    from mncloud.records.store import append_event

    if not meta.records_events or meta.end_recorded:
        return
    if status.times is not None and follow_times(meta, status):
        return
    if not status.state.is_final:
        return
    ended = meta.downed_at or meta.gone_at
    if meta.kind == CLUSTER and ended is None:
        return  # the cluster is still up, billing, until `down` or its autodown
    kind = "failure" if status.state is RunState.FAILED else "finish"
    at = ended if meta.kind == CLUSTER else status.ended_at or ended or time.time()
    detail = f"SkyPilot: {status.detail or status.state.value.lower()}"
    _tell_trackers(append_event(meta.name, kind, detail=detail, at=at, run_id=meta.run_id))
    meta.end_recorded = True


def _tell_trackers(record: RunRecord | None) -> None:
    """An attempt's end recorded: mncloud's figures to the run's tracker run; a server that
    does not take them is logged, never raised (`records.trackers.post_figures`)."""
    from mncloud.records.trackers import post_figures

    for warning in post_figures(record) if record is not None else []:
        log.warning("%s", warning)


def follow_times(meta: RunMeta, status: RunStatus) -> bool:
    """The record bills what the queue says ran (`records.ledger.catch_up`): waiting unbilled,
    each stint from its start, the end at SkyPilot's `end_at` (a CANCELLING job bills on until
    its VMs are gone). True when the end is recorded, or not yet due (still CANCELLING)."""
    from mncloud.errors import MncloudError
    from mncloud.records.ledger import catch_up
    from mncloud.records.store import append_event, find_record

    assert status.times is not None
    try:
        record = find_record(meta.run_id)
    except MncloudError:
        return False
    end_kind = "failure" if status.state is RunState.FAILED else "finish"
    launch = next((e for e in reversed(record.events) if e.kind == "launch"), None)
    placement = {} if launch is None else launch.model_dump(include=_PLACEMENT)
    added = catch_up(record, status.times, time.time(), spot=bool(meta.spot), end_kind=end_kind)
    for kind, at in added:
        detail = f"SkyPilot: {status.detail}" if kind in (end_kind, "preemption") else (
            "SkyPilot: the job's VMs run it" if kind == "running" else
            "SkyPilot: the job waits for VMs (nothing billed)")  # fmt: skip
        extra = placement if kind == "running" else {}
        now = append_event(meta.name, kind, detail=detail, at=at, run_id=meta.run_id, **extra)
        if kind in (end_kind, "preemption"):
            _tell_trackers(now)
    if any(kind == end_kind for kind, _ in added):
        meta.end_recorded = True
    if meta.kind == CLUSTER:
        return False  # its end is `down` (or its autodown), below
    held = status.failure is None or status.times.running  # a failed group's rest runs on
    if status.state.is_final and status.times.ended_at is None and held:
        return True  # CANCELLING: the end is SkyPilot's `end_at`, when its VMs are gone
    return meta.end_recorded


_PLACEMENT = {"cloud", "region", "instance_type", "spot", "hourly_price"}


def record_superseded(name: str) -> None:
    """Before a new launch of `name` replaces its meta: the end of the earlier launch's record
    if no `status` saw it (a `--cluster` run relaunched onto its own cluster, still up, is
    billed from here on under the new record)."""
    from mncloud.records.store import append_event

    old = load_meta(name)
    if old is None or not old.records_events or old.end_recorded:
        return
    detail = "SkyPilot: a new launch of the run took over"
    append_event(name, "finish", detail=detail, at=time.time(), run_id=old.run_id)
    old.end_recorded = True
    save_meta(old)
