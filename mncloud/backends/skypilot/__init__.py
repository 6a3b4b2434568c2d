"""The cloud engine: the rendered task handed to SkyPilot's Python SDK. We never create VMs.

Every cloud run is a **managed job** (`sky.jobs.launch`, job name = run name), spot or
on-demand: SkyPilot's jobs controller relaunches the cluster when its VMs are lost (a spot
preemption, an on-demand VM failing) and, per `resources.job_recovery` (rendered by
render/), after errors: FAILOVER for several nodes — it first retries where the cluster was
(quota and placement are known good there, and tearing down a whole fleet on every flap costs
more than a retry) and only then moves on through the ordered fallbacks; EAGER_NEXT_REGION for
one node. `max_restarts_on_errors` (`--max-restarts`) bounds restarts after user-code errors;
exit code 115 (a clean stop on a preemption notice) always counts as a preemption. The jobs
controller tears the cluster down when the job ends, however it ends. (An older mncloud
launched on-demand runs as a cluster, `sky.launch` with autodown; those runs' records, kind
`cluster`, are still read by status, logs and down.)

`down` cancels by job id (`cancel.py`), never by name: SkyPilot cancels nothing by a name two
live jobs share. It finds every live job of the run — the recorded id, and the live jobs
SkyPilot's queue holds under the run's exact name (a launch whose id never came back, one made
by a controller's VM or another machine) — cancels them and returns once SkyPilot reports
them ended; a second `down` cancels nothing and says so.

The 0.14 SDK is asynchronous: each call returns a request id, and `sky.stream_and_get`
(progress streamed to `progress`, stderr by default, keeping stdout for `--json`) or `sky.get`
waits for the result. SkyPilot's exceptions come back through those and are turned into one
`BackendError` line: the cause and what to do (`sky check`, another region, `--on-demand`,
`sky api start`).

`--dryrun` runs SkyPilot's own dry run in-process (`sky.execution.launch(dryrun=True)`): its
optimizer and provisioner pick a region and write the provisioning config, nothing is
created and no API server is needed. `sky jobs launch` has no dry run; the dry run checks the
cluster the jobs controller would launch.

Secrets: the task names them (`secrets: {NAME: null}`); their values are read from the
user's environment here, at launch, and handed to SkyPilot as `secrets_overrides` — the same
path as `sky launch --secret NAME` — so they never appear in `envs`, files or logs.

Each run keeps `skypilot.json` in its run folder (kind, job id, cloud, region,
instance type, market, hourly price from the plan, launch time, checkpoint URL), which is
what `status` needs to report cost so far and the newest checkpoint.

Modules, by job:

    errors.py    SkyPilot's exceptions → one line
    meta.py      `RunMeta` and its file
    task.py      the `sky.Task` with secrets
    dryrun.py    SkyPilot's own dry run, in-process
    status.py    managed-job and, for old records, cluster states
    cancel.py    cancel by id, wait until ended
    find.py      a run's managed jobs found by the run's own id
    lost.py      a launch whose answer was lost: unknown, resolved from the server
    logs.py      node prefixes
    group.py     a `--recovery node` job group: one managed job of several tasks
                 (`render/jobgroup.py`)
    cluster.py   `up --cluster` and `exec`: a plain cluster kept up between runs
    events.py    a cloud run's billed time in its run record
    notice.py    `down`'s stop notice (`storage/stoprequest.py`)
    host.py      the deadline controller's own jobs (`base.ControllerHost`): `control/`
                 asks these modules through it
    netcheck.py  `mncloud doctor --bandwidth RUN` on a live cluster
    backend.py   `SkyPilotBackend`

SkyPilot itself is imported only inside the functions that call it: importing this package
does not import `sky`.
"""

from mncloud.backends.skypilot.backend import AUTOSTOP_IDLE_MINUTES, SkyPilotBackend
from mncloud.backends.skypilot.cancel import CancelError, cancel_jobs, live_job_ids
from mncloud.backends.skypilot.errors import sky_errors, translate_error
from mncloud.backends.skypilot.logs import prefix_line
from mncloud.backends.skypilot.meta import (
    CLUSTER,
    MANAGED_JOB,
    META_FILE,
    RunMeta,
    load_meta,
    save_meta,
)
from mncloud.backends.skypilot.task import build_task

__all__ = [
    "AUTOSTOP_IDLE_MINUTES",
    "CLUSTER",
    "MANAGED_JOB",
    "META_FILE",
    "CancelError",
    "RunMeta",
    "SkyPilotBackend",
    "build_task",
    "cancel_jobs",
    "live_job_ids",
    "load_meta",
    "prefix_line",
    "save_meta",
    "sky_errors",
    "translate_error",
]
