"""A run's state from SkyPilot: its managed job (spot or on-demand), or, for a run an older
mncloud launched on demand with `sky.launch`, its cluster and the job on it."""

from __future__ import annotations

import re
import time
from typing import Any

from mncloud import constants
from mncloud.backends.base import Failure, RunState, RunStatus
from mncloud.backends.skypilot.errors import (
    no_jobs_controller,
    one_line,
    sky_errors,
    translate_error,
)
from mncloud.backends.skypilot.meta import RunMeta, status_from_meta
from mncloud.records.ledger import RunTimes

CLUSTER_STATES = {
    "PENDING": RunState.PENDING,
    "INIT": RunState.STARTING,
    "UP": RunState.RUNNING,
    "AUTOSTOPPING": RunState.RUNNING,
    "STOPPED": RunState.CANCELLED,
}
"""SkyPilot's cluster states (`sky.ClusterStatus`) → ours. RUNNING (UP, AUTOSTOPPING after its
job ended) means the cluster's job decides (`CLUSTER_JOB_STATES`); STOPPED is over for the run
(its disks still billed)."""
_CLUSTER_DETAILS = {
    RunState.PENDING: "cluster waiting to be scheduled",
    RunState.STARTING: "provisioning",
    RunState.CANCELLED: "cluster stopped (disks still billed); `mncloud down`",
}
CLUSTER_JOB_STATES = {
    "INIT": RunState.PENDING,
    "PENDING": RunState.PENDING,
    "SETTING_UP": RunState.STARTING,
    "RUNNING": RunState.RUNNING,
    "FAILED_DRIVER": RunState.FAILED,
    "SUCCEEDED": RunState.SUCCEEDED,
    "FAILED": RunState.FAILED,
    "FAILED_SETUP": RunState.FAILED,
    "CANCELLED": RunState.CANCELLED,
}
"""SkyPilot's job states on a cluster (`sky.JobStatus`) → ours, every one of them."""
MANAGED_JOB_STATES = {
    "PENDING": RunState.PENDING,
    "SUBMITTED": RunState.PENDING,
    "STARTING": RunState.STARTING,
    "RUNNING": RunState.RUNNING,
    "WINDING_DOWN": RunState.RUNNING,
    "RECOVERING": RunState.RECOVERING,
    "CANCELLING": RunState.CANCELLED,
    "SUCCEEDED": RunState.SUCCEEDED,
    "CANCELLED": RunState.CANCELLED,
    "FAILED": RunState.FAILED,
    "FAILED_SETUP": RunState.FAILED,
    "FAILED_PRECHECKS": RunState.FAILED,
    "FAILED_NO_RESOURCE": RunState.FAILED,
    "FAILED_CONTROLLER": RunState.FAILED,
}
"""SkyPilot's managed-job states (`sky.jobs.ManagedJobStatus`) → ours, every one of them.
CANCELLING is over for the run (a cancel was asked; SkyPilot is cleaning up), though not yet
terminal for SkyPilot: `down` waits for CANCELLED (`cancel.py`)."""
FAILURES = {
    "FAILED": Failure.USER,
    "FAILED_SETUP": Failure.USER,
    "FAILED_DRIVER": Failure.INFRA,
    "FAILED_PRECHECKS": Failure.REFUSED,
    "FAILED_NO_RESOURCE": Failure.CAPACITY,
    "FAILED_CONTROLLER": Failure.INFRA,
}
"""Why a job ended FAILED, for each of SkyPilot's failure states (cluster and managed)."""

QUEUE_FIELDS = [
    "job_id", "job_name", "status", "submitted_at", "start_at", "end_at",
    "last_recovered_at", "job_duration", "recovery_count", "cloud", "region", "infra",
    "cluster_resources", "failure_reason", "details", "task_id",
]  # fmt: skip


def state_of(value: Any, table: dict[str, RunState]) -> RunState:
    """Our state for SkyPilot's `value` (an enum or its name) by `table`; a state newer than
    this SkyPilot (the tables list every one of 0.14's) by its name's prefix."""
    name = raw_state(value)
    return table.get(name, RunState.FAILED if name.startswith("FAILED") else RunState.PENDING)


def raw_state(value: Any) -> str:
    """SkyPilot's own word for a state (an enum or its name)."""
    return str(getattr(value, "value", value))


def failure_of(value: Any) -> Failure | None:
    """Why a job in SkyPilot's state `value` failed (None: it did not)."""
    name = raw_state(value)
    return FAILURES.get(name, Failure.USER if name.startswith("FAILED") else None)


_EXIT_CODES = re.compile(r"exited with exit codes? \[?([\d, ]+)")


def exit_codes(reason: str) -> list[int]:
    """The exit codes SkyPilot's failure reason names ("Job exited with exit code(s) ...")."""
    found = _EXIT_CODES.search(reason)
    return [int(c) for c in found.group(1).replace(",", " ").split()] if found else []


def refused_by_exit(reason: str) -> bool:
    """The job's program refused its input (`REFUSED_EXIT_CODE` among the exit codes SkyPilot's
    failure reason names), so no relaunch would mend it."""
    return constants.REFUSED_EXIT_CODE in exit_codes(reason)


def exit_note(reason: str) -> str:
    """What mncloud's own exit codes among those of SkyPilot's reason mean, for the detail:
    `STORAGE_OUTAGE_EXIT_CODE` (the nodes' bucket did not answer their preflight: recovered by
    `recover_on_exit_codes`, as a preemption's 115 is, without spending --max-restarts)."""
    codes = exit_codes(reason)
    if constants.STORAGE_OUTAGE_EXIT_CODE in codes:
        return (
            f"; exit {constants.STORAGE_OUTAGE_EXIT_CODE} is a storage outage (the bucket did "
            "not answer): recovered, not counted against --max-restarts"
        )
    return ""


def cluster_status(meta: RunMeta, idle_minutes: int) -> RunStatus:
    """A cluster run's status (`up --cluster`, or an older mncloud's on-demand run): its
    cluster's, then its job's on the cluster, with the cluster's idle timer."""
    import sky
    from sky.utils import common

    with sky_errors(f"get the status of {meta.name}"):
        records = sky.get(sky.status([meta.name], refresh=common.StatusRefreshMode.AUTO))
    if not records:
        return _cluster_gone(meta)
    record = records[0]
    cluster_state = raw_state(record["status"])
    meta.cloud = record.get("cloud") or meta.cloud
    meta.region = record.get("region") or meta.region
    cluster = state_of(cluster_state, CLUSTER_STATES)
    if cluster is not RunState.RUNNING:  # not up: the cluster's state is the run's
        return status_from_meta(meta, cluster, _CLUSTER_DETAILS.get(cluster, cluster_state))
    with sky_errors(f"get the job status of {meta.name}"):
        jobs = sky.get(sky.job_status(meta.name, [meta.job_id] if meta.job_id else None))
    job_state = next(iter(jobs.values()), None) if jobs else None
    if job_state is None:
        return status_from_meta(meta, RunState.PENDING, "cluster up, no job yet")
    state = state_of(job_state, CLUSTER_JOB_STATES)
    detail = f"job {meta.job_id}: {raw_state(job_state)}"
    if meta.idle_minutes is not None:  # `up --cluster`: kept up for `exec`, timer from SkyPilot
        detail += f"; {idle_timer(record, meta)}"
        if state.is_final:
            detail += f" (`mncloud exec {meta.name}` reruns on it)"
    elif state.is_final:
        detail += f"; cluster tears down after {idle_minutes} idle minutes"
    status = status_from_meta(meta, state, detail)
    status.failure = failure_of(job_state)
    launched = record.get("launched_at")
    if launched:  # UP since then: its VMs bill from there (not from when `up` was sent)
        ran = max(0.0, time.time() - float(launched))
        status.times = RunTimes(running=True, ran_s=ran, since=float(launched))
    return status


def idle_timer(record: Any, meta: RunMeta) -> str:
    """A cluster's autostop as SkyPilot's record says it (else as the run asked for it)."""
    minutes = record.get("autostop")
    if minutes is None or minutes < 0:
        minutes = meta.idle_minutes
    what = "tears down" if record.get("to_down", True) else "stops"
    return f"cluster {what} after {minutes} idle minutes"


def _cluster_gone(meta: RunMeta) -> RunStatus:
    """The status of a run whose cluster SkyPilot no longer knows."""
    meta.gone_at = meta.gone_at or time.time()
    last = meta.last_state
    if last is not None and last.is_final:
        return status_from_meta(meta, last, "cluster torn down")
    why = "torn down by `mncloud down`" if meta.downed_at else "the cluster is gone"
    return status_from_meta(
        meta,
        RunState.CANCELLED,
        f"{why} (autodown after the job ended, or deleted outside mncloud); "
        f"last seen {last.value if last else 'never'}",
    )


def ask_queue(what: str, **query: Any) -> list[Any]:
    """The managed-jobs queue's records (`sky.jobs.queue_v2(refresh=False, **query)`), one per
    task; none where SkyPilot never launched a managed job (`no_jobs_controller`: its queue
    then fails, and an empty queue is the truth). Other errors: one BackendError line."""
    import sky
    from sky import exceptions as sx

    try:
        with sky_errors(what, keep=(sx.ClusterNotUpError,)):
            answer = sky.get(sky.jobs.queue_v2(refresh=False, **query))
    except sx.ClusterNotUpError as err:
        if no_jobs_controller(err):
            return []
        raise translate_error(err, what) from None
    return list(answer[0] if isinstance(answer, tuple) else answer)


def queue_records(meta: RunMeta, fields: list[str], what: str) -> list[Any]:
    """The managed-jobs queue's records of `meta`'s job (`sky.jobs.queue_v2`), `fields` each."""
    return ask_queue(
        f"get the status of {what}",
        job_ids=[meta.job_id] if meta.job_id is not None else None,
        fields=fields,
        all_users=meta.job_id is not None,  # by id: whoever launched it (a controller)
    )


def managed_job_status(meta: RunMeta) -> RunStatus:
    """A run's status: its managed job's, with recoveries and the failure reason; a job that
    failed (its program's errors outlasted `--max-restarts`) says after how many restarts."""
    records = queue_records(meta, QUEUE_FIELDS, f"managed job {meta.name}")
    mine = [r for r in records if r.get("job_id") == meta.job_id]
    if not mine:
        return vanished(meta)
    record = mine[-1]
    state = state_of(record.get("status"), MANAGED_JOB_STATES)
    meta.cloud = record.get("cloud") or meta.cloud
    meta.region = record.get("region") or meta.region
    recoveries = int(record.get("recovery_count") or 0)
    reason = record.get("failure_reason") or record.get("details") or ""
    raw = getattr(record.get("status"), "value", record.get("status"))
    detail = f"managed job {meta.job_id}: {raw}"
    if state is RunState.FAILED and meta.max_restarts and raw == "FAILED":  # 0: none to count
        detail += f" after {recoveries} restarts (--max-restarts {meta.max_restarts})"
    elif recoveries:
        detail += f", {recoveries} recoveries (preemptions, storage outages, retried errors)"
    if reason:
        detail += f"; {one_line(reason, 160)}{exit_note(reason)}"
    status = status_from_meta(meta, state, detail)
    status.failure = failure_of(raw)
    if status.failure is Failure.USER and refused_by_exit(reason):
        status.failure = Failure.REFUSED
    status.restarts = recoveries
    status.started_at = record.get("start_at") or record.get("submitted_at") or meta.launched_at
    status.ended_at = record.get("end_at") or None
    status.times = queue_times(record, raw)
    return status


#: SkyPilot's states in which VMs hold a job that has started: its `job_duration` grows.
_VMS_HOLD = ("RUNNING", "WINDING_DOWN", "CANCELLING")


def queue_times(record: Any, raw: str) -> RunTimes:
    """When the VMs ran the job, from its queue record: `last_recovered_at` (-1 before it
    started), `job_duration` (run seconds, computed by the queue: `sky/jobs/utils.py`)."""
    since = record.get("last_recovered_at")
    since = float(since) if since is not None and since > 0 else None
    return RunTimes(
        running=raw in _VMS_HOLD and since is not None,
        ran_s=float(record.get("job_duration") or 0.0) if since is not None else 0.0,
        since=since,
        ended_at=record.get("end_at") or None,
        recovering=raw == "RECOVERING",
    )


def vanished(meta: RunMeta) -> RunStatus:
    """The status of a managed job the queue no longer lists (purged, or another server)."""
    status = status_from_meta(meta, RunState.FAILED, f"SkyPilot has no managed job {meta.job_id}")
    status.failure = Failure.VANISHED
    return status
