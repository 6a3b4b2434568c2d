"""`up --cluster` and `exec`: a plain SkyPilot cluster kept up between runs of the task.

Every other cloud run is a managed job, torn down when its job ends. A script that fails on a
typo then costs a fresh cluster; `--cluster` is the one exception: `sky.launch` with
`idle_minutes_to_autostop` and `down=True`, so the cluster stays up while the user iterates
and tears itself down (nothing left billing) once no job ran for `--idle-minutes`. Example:

    mncloud up train.py --cluster --idle-minutes 30 --name dev   # sky.launch: job 1
    (job 1 fails on a typo; the cluster stays up, idle)
    mncloud exec dev                 # sky.exec: job 2, workdir synced, no setup, no provisioning
    mncloud down dev                 # sky.down; or 30 idle minutes later SkyPilot downs it

A cluster run has no recovery: a lost VM ends it (`up --resume` then starts a new cluster).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.meta import (
    CLUSTER,
    RunMeta,
    require_meta,
    save_meta,
    status_from_meta,
)
from mncloud.backends.skypilot.status import CLUSTER_JOB_STATES, raw_state, state_of
from mncloud.errors import MncloudError, SpecError

if TYPE_CHECKING:
    import sky


def launch_cluster(task: sky.Task, meta: RunMeta, idle_minutes: int, progress: TextIO) -> RunStatus:
    """`sky.launch` the task on a new cluster named after the run, autodown after
    `idle_minutes` without a job; return once SkyPilot started its first job."""
    import sky

    meta.kind, meta.idle_minutes, meta.max_restarts = CLUSTER, idle_minutes, None
    try:
        with sky_errors(f"launch cluster {meta.name}"):
            request_id = sky.launch(
                task, cluster_name=meta.name, idle_minutes_to_autostop=idle_minutes, down=True
            )
            meta.request_id = str(request_id)
            save_meta(meta)
            job_id, _handle = sky.stream_and_get(request_id, output_stream=progress)
    except MncloudError as err:
        meta.error, meta.last_state = str(err), RunState.FAILED
        save_meta(meta)
        raise
    meta.job_id = int(job_id) if job_id is not None else None
    meta.last_state = RunState.PENDING
    save_meta(meta)
    return status_from_meta(
        meta, meta.last_state, f"launched (cluster {meta.name}, job {meta.job_id}); {_timer(meta)}"
    )


EXEC_NEEDS = "`exec` reruns on a cluster kept up by `up --cluster`"


def require_live_cluster(name: str, needs: str = EXEC_NEEDS) -> RunMeta:
    """The record of `name`, a cluster that is UP with no job running; SpecError saying what
    the run is, what `needs` a live cluster, and what to do otherwise."""
    import sky
    from sky.utils import common

    meta = require_meta(name)
    again = f"`mncloud up SCRIPT --cluster --name {name} --resume` starts one"
    if meta.kind != CLUSTER:
        raise SpecError(
            f"run {name!r} is a SkyPilot managed job, not a live cluster: {needs}; {again}"
        )
    if meta.downed_at is not None or meta.error is not None:
        why = "torn down by `mncloud down`" if meta.downed_at else f"never launched: {meta.error}"
        raise SpecError(f"run {name!r} has no live cluster ({why}); {again}")
    with sky_errors(f"get the status of cluster {name}"):
        records = sky.get(sky.status([name], refresh=common.StatusRefreshMode.AUTO))
    if not records:
        raise SpecError(
            f"run {name!r}'s cluster is gone (torn down after {meta.idle_minutes} idle minutes, "
            f"or deleted outside mncloud); {again}"
        )
    cluster = raw_state(records[0]["status"])
    if cluster != "UP":
        raise SpecError(f"run {name!r}'s cluster is {cluster}, not UP; wait for it, or {again}")
    _require_no_job_running(meta)
    return meta


def _require_no_job_running(meta: RunMeta) -> None:
    """SpecError while the cluster's newest job still runs: two runs would write one run's
    checkpoints at once."""
    import sky

    if meta.job_id is None:
        return
    with sky_errors(f"get the job status of {meta.name}"):
        jobs = sky.get(sky.job_status(meta.name, [meta.job_id]))
    job_state = (jobs or {}).get(meta.job_id)
    if job_state is not None and not state_of(job_state, CLUSTER_JOB_STATES).is_final:
        raise SpecError(
            f"run {meta.name!r} still runs job {meta.job_id} ({raw_state(job_state)}) on its "
            f"cluster; wait for it (`mncloud logs {meta.name} -f`) or stop it with "
            f"`mncloud down {meta.name}`"
        )


def exec_on_cluster(task: sky.Task, meta: RunMeta, progress: TextIO) -> RunStatus:
    """`sky.exec` the task on the run's live cluster (`require_live_cluster`): the workdir
    synced, no provisioning, no setup; the run's record names the new job."""
    import sky

    with sky_errors(f"exec on cluster {meta.name}"):
        request_id = sky.exec(task, cluster_name=meta.name)
        job_id, _handle = sky.stream_and_get(request_id, output_stream=progress)
    meta.job_id = int(job_id) if job_id is not None else None
    meta.request_id, meta.last_state = str(request_id), RunState.PENDING
    meta.launched_at = meta.launched_at or time.time()
    save_meta(meta)
    return status_from_meta(
        meta, RunState.PENDING, f"exec: job {meta.job_id} on cluster {meta.name}; {_timer(meta)}"
    )


def _timer(meta: RunMeta) -> str:
    return f"tears down after {meta.idle_minutes} idle minutes (`mncloud down` ends it now)"
