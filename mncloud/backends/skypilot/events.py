"""A cloud run's billed time in its run record: the events the goodput ledger prices.

SkyPilot bills from the launch until the job's cluster is gone; a managed job recovers from a
preemption by itself, so the record holds the launch and the end, and the relaunches between
are read off the run's telemetry (`operate.with_relaunches`). This backend writes:

    launch    when SkyPilot accepted the job: the plan's placement and $/h (all nodes)
    finish    when `status` first sees the job SUCCEEDED or CANCELLED (at SkyPilot's end time)
    failure   when it first sees it FAILED; a `--cluster` run ends at `down` (or its autodown):
              an idle cluster bills on after its job

A deadline controller's launches record their own events (`control/loop.py`): the launch
request says so (`LaunchRequest.record_events`), and the run's meta remembers it.
"""

from __future__ import annotations

import time

from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.skypilot.meta import CLUSTER, RunMeta, load_meta, save_meta


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

    if not meta.records_events or meta.end_recorded or not status.state.is_final:
        return
    ended = meta.downed_at or meta.gone_at
    if meta.kind == CLUSTER and ended is None:
        return  # the cluster is still up, billing, until `down` or its autodown
    kind = "failure" if status.state is RunState.FAILED else "finish"
    at = ended if meta.kind == CLUSTER else status.ended_at or ended or time.time()
    detail = f"SkyPilot: {status.detail or status.state.value.lower()}"
    append_event(meta.name, kind, detail=detail, at=at, run_id=meta.run_id)
    meta.end_recorded = True


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
