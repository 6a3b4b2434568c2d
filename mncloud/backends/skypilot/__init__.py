"""The cloud engine: the rendered task handed to SkyPilot's Python SDK. We never create VMs.

Two launch paths, chosen by the rendered task's market (the plan's choice):

- **On-demand → a cluster** (`sky.launch`, cluster name = run name) with
  `idle_minutes_to_autostop` and `down=True`: once the training job ends, however it ends, the
  cluster tears itself down after `AUTOSTOP_IDLE_MINUTES` idle minutes. An H100:8 × 4 cluster
  costs ~$128/h; a forgotten one must not burn through a weekend. The few idle minutes leave
  time for `mncloud logs` right after the end. Stop (not down) would keep paying for disks.
- **Spot → a managed job** (`sky.jobs.launch`, job name = run name). SkyPilot's jobs controller
  relaunches the cluster on preemption and, per `resources.job_recovery` (rendered by
  render.py), after errors: FAILOVER for several nodes — it first retries where the cluster
  was (quota and placement are known good there, and tearing down a whole fleet on every flap
  costs more than a retry) and only then moves on through the ordered fallbacks;
  EAGER_NEXT_REGION for one node. `max_restarts_on_errors` bounds restarts after user-code
  errors; exit code 115 (a clean stop on a preemption notice) always counts as a preemption.

The 0.14 SDK is asynchronous: each call returns a request id, and `sky.stream_and_get`
(progress streamed to `progress`, stderr by default, keeping stdout for `--json`) or `sky.get`
waits for the result. SkyPilot's exceptions come back through those and are turned into one
`BackendError` line: the cause and what to do (`sky check`, another region, `--on-demand`,
`sky api start`).

`--dryrun` runs SkyPilot's own dry run in-process (`sky.execution.launch(dryrun=True)`): its
optimizer and provisioner pick a region and write the provisioning config, nothing is
created and no API server is needed. `sky jobs launch` has no dry run; for a spot run the dry
run checks the cluster the jobs controller would launch.

Secrets: the task names them (`secrets: {NAME: null}`); their values are read from the
user's environment here, at launch, and handed to SkyPilot as `secrets_overrides` — the same
path as `sky launch --secret NAME` — so they never appear in `envs`, files or logs.

Each run keeps `skypilot.json` in its run folder (kind, cluster/job ids, cloud, region,
instance type, market, hourly price from the plan, launch time, checkpoint URL), which is
what `status` needs to report cost so far and the newest checkpoint.

Modules, by job: `errors` (SkyPilot's exceptions → one line), `meta` (`RunMeta` and its
file), `task` (the `sky.Task` with secrets), `dryrun`, `status` (cluster and managed-job
states), `logs` (node prefixes), `group` (a `--recovery node` job group: one managed job of
several tasks, `render/jobgroup.py`), `backend` (`SkyPilotBackend`). SkyPilot itself is imported
only inside the functions that call it: importing this package does not import `sky`.
"""

from mncloud.backends.skypilot.backend import AUTOSTOP_IDLE_MINUTES, SkyPilotBackend
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
    "RunMeta",
    "SkyPilotBackend",
    "build_task",
    "load_meta",
    "prefix_line",
    "save_meta",
    "sky_errors",
    "translate_error",
]
