"""`RunMeta`: what a launch remembers in `<run dir>/skypilot.json`, and the status it gives."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from mncloud import layout
from mncloud.backends.base import RunState, RunStatus
from mncloud.errors import RunNotFoundError

if TYPE_CHECKING:
    from mncloud.plan import Plan
    from mncloud.spec import JobSpec

BACKEND_NAME = "skypilot"
META_FILE = "skypilot.json"
CLUSTER = "cluster"
MANAGED_JOB = "managed-job"
JOB_GROUP = "job-group"


class RunMeta(BaseModel):
    """What a launch remembers in `<run dir>/skypilot.json`."""

    kind: str
    """`managed-job` (spot or on-demand), `job-group` (`--recovery node`: one managed job of
    several tasks, `jobgroup.py`) or `cluster` (`up --cluster`, kept up for `exec`; also the
    records of on-demand runs an older mncloud launched with `sky.launch`)."""
    name: str
    nodes: int
    spot: bool
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None
    hourly_per_node: float | None = None
    """USD per node-hour from the plan (SkyPilot's catalog)."""
    launched_at: float | None = None
    job_id: int | None = None
    """The managed job id (the job id on the cluster, for a `cluster` record)."""
    max_restarts: int | None = None
    """`--max-restarts`: the user-code errors SkyPilot restarts the job after."""
    ckpt_uri: str | None = None
    request_id: str | None = None
    downed_at: float | None = None
    last_state: RunState | None = None
    error: str | None = None
    """Why the launch failed, when it did."""
    tasks: list[str] = []
    """A job group's task names (lighthouse first, then node 0, 1, …); empty otherwise."""
    idle_minutes: int | None = None
    """`up --cluster`: the cluster's autodown after this many idle minutes (`cluster.py`)."""
    records_events: bool = False
    """Whether this backend writes the run record's launch and end (`events.py`); False for
    a deadline controller's launches (it writes its own) and runs of an older mncloud."""
    end_recorded: bool = False
    run_id: str | None = None
    """The run record this launch's events go to (a later launch of the name has its own)."""
    gone_at: float | None = None
    """When `status` first found the run's cluster gone (a `--cluster` run's autodown)."""

    @property
    def hourly_total(self) -> float | None:
        return None if self.hourly_per_node is None else self.hourly_per_node * self.nodes


def meta_path(run_name: str) -> Path:
    return layout.run_dir(run_name) / META_FILE


def load_meta(run_name: str) -> RunMeta | None:
    path = meta_path(run_name)
    return RunMeta.model_validate_json(path.read_text()) if path.is_file() else None


def save_meta(meta: RunMeta) -> None:
    path = meta_path(meta.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(meta.model_dump_json(indent=2))


def require_meta(run_name: str) -> RunMeta:
    """The run's `RunMeta`; RunNotFoundError when its launch never started."""
    meta = load_meta(run_name)
    if meta is None:
        raise RunNotFoundError(
            f"run {run_name!r} has no SkyPilot record (its launch never started); "
            "start it again with `mncloud up`"
        )
    return meta


def meta_from_plan(
    spec: JobSpec,
    plan: Plan | None,
    spot: bool,
    config: dict[str, Any],
    tasks: list[str] | tuple[str, ...] = (),
) -> RunMeta:
    """A new run's `RunMeta`: where and at what price from the plan, else the task's infra
    (`tasks`: a job group's task names)."""
    meta = RunMeta(
        kind=JOB_GROUP if tasks else MANAGED_JOB,
        tasks=list(tasks),
        max_restarts=spec.max_restarts,
        name=spec.name,
        nodes=spec.nodes,
        spot=spot,
        launched_at=time.time(),
        ckpt_uri=spec.ckpt_uri,
    )
    if plan is not None:
        choice = plan.choice
        meta.cloud, meta.region = choice.cloud, choice.region
        meta.instance_type, meta.hourly_per_node = choice.instance_type, choice.hourly_per_node
    else:
        infra = str((config.get("resources") or {}).get("infra") or "")
        parts = [p for p in infra.split("/") if p and p != "*"]
        meta.cloud = parts[0] if parts else None
        meta.region = parts[1] if len(parts) > 1 else None
    return meta


def status_from_meta(meta: RunMeta, state: RunState, detail: str) -> RunStatus:
    """The run's status as `meta` knows it, in `state`, with `detail`."""
    ended = meta.downed_at if state.is_final else None
    return RunStatus(
        name=meta.name,
        backend=BACKEND_NAME,
        state=state,
        nodes=meta.nodes,
        cloud=meta.cloud,
        region=meta.region,
        instance_type=meta.instance_type,
        spot=meta.spot,
        started_at=meta.launched_at,
        ended_at=ended,
        hourly_total=meta.hourly_total,
        ckpt_uri=meta.ckpt_uri,
        detail=detail,
    )
