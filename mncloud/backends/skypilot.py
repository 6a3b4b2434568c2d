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
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml
from pydantic import BaseModel

from mncloud import layout
from mncloud.backends.base import LaunchRequest, RunState, RunStatus
from mncloud.errors import BackendError, MncloudError, RunNotFoundError

if TYPE_CHECKING:
    import sky

    from mncloud.plan import Plan
    from mncloud.spec import JobSpec

META_FILE = "skypilot.json"
AUTOSTOP_IDLE_MINUTES = 10
"""Idle minutes before an on-demand cluster tears itself down after its job ended."""

CLUSTER = "cluster"
MANAGED_JOB = "managed-job"


class RunMeta(BaseModel):
    """What a launch remembers in `<run dir>/skypilot.json`."""

    kind: str
    """`cluster` (on-demand) or `managed-job` (spot)."""
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
    """The job id on the cluster (on-demand) or the managed job id (spot)."""
    ckpt_uri: str | None = None
    request_id: str | None = None
    downed_at: float | None = None
    last_state: RunState | None = None
    error: str | None = None
    """Why the launch failed, when it did."""

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


# ----------------------------------------------------------------------------- the Task


def build_task(request: LaunchRequest, environ: dict[str, str] | None = None) -> sky.Task:
    """The `sky.Task` for a launch: the rendered YAML, secrets filled from `environ`."""
    import sky

    environ = dict(os.environ if environ is None else environ)
    missing = [name for name in request.spec.secrets if name not in environ]
    if missing:
        raise BackendError(
            f"secret {', '.join(missing)} is not set in your environment; export it before "
            "`mncloud up` (its value is sent to SkyPilot as a secret, never written to files)"
        )
    config = copy.deepcopy(request.task.config)  # SkyPilot pops keys from its argument
    overrides = [(name, environ[name]) for name in request.spec.secrets]
    try:
        return sky.Task.from_yaml_config(config, secrets_overrides=overrides or None)
    except Exception as err:  # SkyPilot raises ValueError and its own types
        raise BackendError(f"SkyPilot rejects the task: {_one_line(err)}") from None


# ------------------------------------------------------------------------------ errors


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _one_line(err: BaseException | str, limit: int = 300) -> str:
    text = " ".join(_ANSI.sub("", str(err)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def translate_error(err: BaseException, action: str) -> MncloudError:
    """One actionable line for an exception raised by SkyPilot while doing `action`."""
    from sky import exceptions as sx

    cause = _one_line(err) or type(err).__name__
    if isinstance(err, MncloudError):
        return err
    if isinstance(err, sx.ApiServerConnectionError):
        return BackendError(
            f"cannot {action}: SkyPilot's API server is unreachable ({cause}); start one with "
            "`sky api start` or check `sky api info`"
        )
    if isinstance(err, sx.ApiServerAuthenticationError):
        return BackendError(
            f"cannot {action}: SkyPilot's API server wants a login; `sky api login`"
        )
    if isinstance(err, sx.NoCloudAccessError):
        return BackendError(
            f"cannot {action}: SkyPilot has no cloud enabled ({cause}); run `sky check` and set "
            "up credentials for at least one cloud"
        )
    if isinstance(err, (sx.InvalidCloudCredentials, sx.CloudUserIdentityError)):
        return BackendError(
            f"cannot {action}: cloud credentials rejected ({cause}); run `sky check` to see which"
        )
    if isinstance(err, (sx.ResourcesUnavailableError, sx.ProvisionPrechecksError)):
        lowered = cause.lower()
        if "quota" in lowered:
            advice = "request a quota increase, or try another --region / --cloud"
        else:
            advice = "try another --region or --cloud, --on-demand instead of spot, or later"
        return BackendError(f"cannot {action}: no capacity ({cause}); {advice}")
    if isinstance(err, sx.ResourcesMismatchError):
        return BackendError(
            f"cannot {action}: a cluster of that name exists with other resources ({cause}); "
            "`mncloud down` it or pick another --name"
        )
    if isinstance(err, sx.ClusterDoesNotExist):
        return RunNotFoundError(f"cannot {action}: SkyPilot has no such cluster ({cause})")
    if isinstance(err, sx.ClusterNotUpError):
        return BackendError(
            f"cannot {action}: the cluster is not up ({cause}); see `mncloud status`"
        )
    if isinstance(err, sx.NotSupportedError):
        return BackendError(f"cannot {action}: SkyPilot does not support this ({cause})")
    if isinstance(err, sx.PermissionDeniedError):
        return BackendError(f"cannot {action}: permission denied by SkyPilot ({cause})")
    return BackendError(f"cannot {action}: SkyPilot: {type(err).__name__}: {cause}")


@contextlib.contextmanager
def sky_errors(action: str, keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn whatever SkyPilot raises inside the block into one BackendError line; the
    exception types in `keep` pass through for the caller to handle."""
    try:
        yield
    except (KeyboardInterrupt, MncloudError, *keep):
        raise
    except Exception as err:
        raise translate_error(err, action) from None


# ----------------------------------------------------------------------------- mappings

_CLUSTER_JOB_STATES = {
    "INIT": RunState.PENDING,
    "PENDING": RunState.PENDING,
    "SETTING_UP": RunState.STARTING,
    "RUNNING": RunState.RUNNING,
    "SUCCEEDED": RunState.SUCCEEDED,
    "CANCELLED": RunState.CANCELLED,
}
_MANAGED_JOB_STATES = {
    "PENDING": RunState.PENDING,
    "SUBMITTED": RunState.PENDING,
    "STARTING": RunState.STARTING,
    "RUNNING": RunState.RUNNING,
    "WINDING_DOWN": RunState.RUNNING,
    "RECOVERING": RunState.RECOVERING,
    "CANCELLING": RunState.CANCELLED,
    "CANCELLED": RunState.CANCELLED,
    "SUCCEEDED": RunState.SUCCEEDED,
}


def _state_of(value: Any, table: dict[str, RunState]) -> RunState:
    name = str(getattr(value, "value", value))
    return table.get(name, RunState.FAILED if name.startswith("FAILED") else RunState.PENDING)


# SkyPilot prefixes each node's lines: "(head, rank=0, pid=412) ...",
# "(worker1, rank=1, pid=97, ip=10.0.0.5) ...", or "(train, pid=12) ..." on one node.
_NODE_PREFIX = re.compile(
    r"^\((?P<node>head|worker(?P<idx>\d+)|[^,()]+?)(?:, rank=(?P<rank>\d+))?, pid=\d+"
    r"(?:, ip=[^)]*)?\) ?"
)


def prefix_line(line: str) -> tuple[int | None, str]:
    """SkyPilot's node prefix → `[node N] text`; lines of SkyPilot's own get `[sky] `."""
    match = _NODE_PREFIX.match(line)
    if not match:
        return None, f"[sky] {line}"
    if match.group("rank") is not None:
        node = int(match.group("rank"))
    elif match.group("idx") is not None:
        node = int(match.group("idx"))
    else:
        node = 0
    return node, f"[node {node}] {line[match.end() :]}"


# ------------------------------------------------------------------------------ backend


class SkyPilotBackend:
    """Runs on clouds through SkyPilot: a cluster for on-demand, a managed job for spot."""

    name = "skypilot"

    def __init__(
        self, progress: TextIO | None = None, idle_minutes: int = AUTOSTOP_IDLE_MINUTES
    ) -> None:
        self.progress = progress if progress is not None else sys.stderr
        """Where SkyPilot's provisioning progress is streamed while `launch` waits."""
        self.idle_minutes = idle_minutes

    # ---------------------------------------------------------------- launch
    def launch(self, request: LaunchRequest) -> RunStatus:
        """Launch the run (or dry-run it); return once SkyPilot accepted the job."""
        spec, config, spot = request.spec, request.task.config, request.task.spot
        task = build_task(request)
        if request.dryrun:
            return self._dryrun(task, spec, request.plan, spot)
        meta = _meta_from_plan(spec, request.plan, spot, config)
        try:
            if spot:
                meta.job_id = self._launch_managed_job(task, spec.name, meta)
            else:
                meta.job_id = self._launch_cluster(task, spec.name, meta)
        except MncloudError as err:
            meta.error = str(err)
            meta.last_state = RunState.FAILED
            save_meta(meta)
            raise
        meta.last_state = RunState.PENDING if spot else RunState.RUNNING
        save_meta(meta)
        what = f"managed job {meta.job_id}" if spot else f"cluster {spec.name}, job {meta.job_id}"
        return self._status_from_meta(meta, meta.last_state, f"launched ({what})")

    def _launch_cluster(self, task: sky.Task, name: str, meta: RunMeta) -> int | None:
        import sky

        with sky_errors(f"launch cluster {name}"):
            request_id = sky.launch(
                task,
                cluster_name=name,
                idle_minutes_to_autostop=self.idle_minutes,
                down=True,
            )
            meta.request_id = str(request_id)
            save_meta(meta)
            job_id, _handle = sky.stream_and_get(request_id, output_stream=self.progress)
        return None if job_id is None else int(job_id)

    def _launch_managed_job(self, task: sky.Task, name: str, meta: RunMeta) -> int | None:
        import sky

        with sky_errors(f"launch managed job {name}"):
            request_id = sky.jobs.launch(task, name=name)
            meta.request_id = str(request_id)
            save_meta(meta)
            job_ids, _handle = sky.stream_and_get(request_id, output_stream=self.progress)
        return int(job_ids[0]) if job_ids else None

    def _dryrun(self, task: sky.Task, spec: JobSpec, plan: Plan | None, spot: bool) -> RunStatus:
        from sky import exceptions as sx
        from sky import execution, sky_logging

        try:
            with (
                sky_errors(f"dry-run {spec.name}", keep=(sx.NoCloudAccessError,)),
                sky_logging.silent(),
            ):
                execution.launch(
                    task,
                    cluster_name=spec.name,
                    dryrun=True,
                    idle_minutes_to_autostop=None if spot else self.idle_minutes,
                    down=not spot,
                    stream_logs=False,
                    _quiet_optimizer=True,
                )
        except sx.NoCloudAccessError:
            return self._dryrun_without_credentials(spec, plan, spot)
        chosen = _dryrun_choice(spec.name)
        what = "a managed spot job" if spot else "an on-demand cluster"
        where = "/".join(v for v in (chosen.get("cloud"), chosen.get("region")) if v)
        node = chosen.get("instance_type") or "?"
        detail = f"dry run passed: SkyPilot would launch {spec.nodes}× {node} in {where or '?'} "
        detail += f"as {what}; nothing was provisioned"
        if plan is not None and chosen.get("region") and chosen["region"] != plan.choice.region:
            detail += (
                f" (the plan's first choice {plan.choice.where} was passed over by SkyPilot; "
                "see `sky launch --dryrun` for why)"
            )
        return RunStatus(
            name=spec.name,
            backend=self.name,
            state=RunState.PENDING,
            nodes=spec.nodes,
            cloud=chosen.get("cloud"),
            region=chosen.get("region"),
            instance_type=chosen.get("instance_type"),
            spot=spot,
            hourly_total=plan.choice.hourly_total if plan is not None else None,
            ckpt_uri=layout.ckpt_uri(spec.bucket, spec.name) if spec.bucket else None,
            detail=detail,
        )

    def _dryrun_without_credentials(
        self, spec: JobSpec, plan: Plan | None, spot: bool
    ) -> RunStatus:
        """What a dry run can check with no cloud credentials: the plan (from the catalog)
        and the task (SkyPilot's schema and parser); SkyPilot's optimizer needs `sky check`."""
        choice = plan.choice if plan is not None else None
        where = f"{choice.instance_type} in {choice.cloud}/{choice.region}" if choice else "?"
        clouds = (
            " or ".join(dict.fromkeys(c.cloud for c in [plan.choice, *plan.fallbacks]))
            if plan
            else ""
        )
        detail = (
            f"dry run: plan and task are valid ({spec.nodes}× {where}, "
            f"{'spot' if spot else 'on-demand'}); SkyPilot's own dry run needs credentials for "
            f"{clouds or 'a cloud'}: set them up and run `sky check`; nothing was provisioned"
        )
        return RunStatus(
            name=spec.name,
            backend=self.name,
            state=RunState.PENDING,
            nodes=spec.nodes,
            cloud=plan.choice.cloud if plan else None,
            region=plan.choice.region if plan else None,
            instance_type=plan.choice.instance_type if plan else None,
            spot=spot,
            hourly_total=plan.choice.hourly_total if plan is not None else None,
            ckpt_uri=layout.ckpt_uri(spec.bucket, spec.name) if spec.bucket else None,
            detail=detail,
        )

    # ---------------------------------------------------------------- status
    def status(self, run_name: str) -> RunStatus:
        """Ask SkyPilot for the run's state; add the newest checkpoint and cost so far."""
        meta = self._meta(run_name)
        if meta.error is not None:
            return self._status_from_meta(meta, RunState.FAILED, f"launch failed: {meta.error}")
        if meta.kind == MANAGED_JOB:
            status = self._managed_job_status(meta)
        else:
            status = self._cluster_status(meta)
        if status.state != meta.last_state:
            meta.last_state = status.state
            save_meta(meta)
        return status

    def _cluster_status(self, meta: RunMeta) -> RunStatus:
        import sky
        from sky.utils import common

        with sky_errors(f"get the status of {meta.name}"):
            records = sky.get(sky.status([meta.name], refresh=common.StatusRefreshMode.AUTO))
        if not records:
            last = meta.last_state
            if last is not None and last.is_final:
                return self._status_from_meta(meta, last, "cluster torn down")
            why = "torn down by `mncloud down`" if meta.downed_at else "the cluster is gone"
            return self._status_from_meta(
                meta,
                RunState.CANCELLED,
                f"{why} (autodown after the job ended, or deleted outside mncloud); "
                f"last seen {last.value if last else 'never'}",
            )
        record = records[0]
        cluster_state = str(getattr(record["status"], "value", record["status"]))
        meta.cloud = record.get("cloud") or meta.cloud
        meta.region = record.get("region") or meta.region
        if cluster_state == "INIT":
            return self._status_from_meta(meta, RunState.STARTING, "provisioning")
        if cluster_state == "STOPPED":
            return self._status_from_meta(
                meta, RunState.CANCELLED, "cluster stopped (disks still billed); `mncloud down`"
            )
        with sky_errors(f"get the job status of {meta.name}"):
            jobs = sky.get(sky.job_status(meta.name, [meta.job_id] if meta.job_id else None))
        job_state = next(iter(jobs.values()), None) if jobs else None
        if job_state is None:
            return self._status_from_meta(meta, RunState.PENDING, "cluster up, no job yet")
        state = _state_of(job_state, _CLUSTER_JOB_STATES)
        detail = f"job {meta.job_id}: {getattr(job_state, 'value', job_state)}"
        if state.is_final:
            detail += f"; cluster tears down after {self.idle_minutes} idle minutes"
        return self._status_from_meta(meta, state, detail)

    def _managed_job_status(self, meta: RunMeta) -> RunStatus:
        import sky

        fields = [
            "job_id", "job_name", "status", "submitted_at", "start_at", "end_at",
            "recovery_count", "cloud", "region", "infra", "cluster_resources",
            "failure_reason", "details", "task_id",
        ]  # fmt: skip
        with sky_errors(f"get the status of managed job {meta.name}"):
            answer = sky.get(
                sky.jobs.queue_v2(
                    refresh=False,
                    job_ids=[meta.job_id] if meta.job_id is not None else None,
                    fields=fields,
                )
            )
        records = answer[0] if isinstance(answer, tuple) else answer
        mine = [r for r in records if r.get("job_id") == meta.job_id]
        if not mine:
            return self._status_from_meta(
                meta, RunState.FAILED, f"SkyPilot has no managed job {meta.job_id}"
            )
        record = mine[-1]
        state = _state_of(record.get("status"), _MANAGED_JOB_STATES)
        meta.cloud = record.get("cloud") or meta.cloud
        meta.region = record.get("region") or meta.region
        recoveries = int(record.get("recovery_count") or 0)
        reason = record.get("failure_reason") or record.get("details") or ""
        raw = getattr(record.get("status"), "value", record.get("status"))
        detail = f"managed job {meta.job_id}: {raw}"
        if recoveries:
            detail += f", {recoveries} recoveries (preemptions and retried errors)"
        if reason:
            detail += f"; {_one_line(reason, 160)}"
        status = self._status_from_meta(meta, state, detail)
        status.restarts = recoveries
        status.started_at = record.get("start_at") or record.get("submitted_at") or meta.launched_at
        status.ended_at = record.get("end_at") or None
        return status

    # ------------------------------------------------------------------ logs
    def logs(self, run_name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        """SkyPilot's logs of the run, each line prefixed `[node N]` (`[sky]` for its own)."""
        import sky

        meta = self._meta(run_name)
        if meta.error is not None:
            raise BackendError(f"{run_name} never launched: {meta.error}")
        with sky_errors(f"read the logs of {run_name}"):
            if meta.kind == MANAGED_JOB:
                chunks = sky.jobs.tail_logs(
                    job_id=meta.job_id, follow=follow, preload_content=False
                )
            else:
                chunks = sky.tail_logs(run_name, meta.job_id, follow=follow, preload_content=False)
            yield from _prefixed_lines(chunks, node)

    # ------------------------------------------------------------------ down
    def down(self, run_name: str) -> RunStatus:
        """Tear the cluster down, or cancel the managed job; idempotent."""
        import sky

        meta = self._meta(run_name)
        if meta.error is None:
            try:
                with sky_errors(f"tear down {run_name}"):
                    if meta.kind == MANAGED_JOB:
                        if meta.job_id is not None:
                            sky.get(sky.jobs.cancel(job_ids=[meta.job_id]))
                    else:
                        sky.get(sky.down(run_name))
            except RunNotFoundError:
                pass  # SkyPilot has no such cluster: already gone, down is idempotent
        meta.downed_at = meta.downed_at or time.time()
        save_meta(meta)
        if meta.kind == MANAGED_JOB and meta.error is None:
            return self.status(run_name)
        final = meta.last_state if meta.last_state and meta.last_state.is_final else None
        state = final or RunState.CANCELLED
        return self._status_from_meta(meta, state, "cluster torn down; checkpoints stay")

    # --------------------------------------------------------------- helpers
    def _meta(self, run_name: str) -> RunMeta:
        meta = load_meta(run_name)
        if meta is None:
            raise RunNotFoundError(
                f"run {run_name!r} has no SkyPilot record (its launch never started); "
                "start it again with `mncloud up`"
            )
        return meta

    def _status_from_meta(self, meta: RunMeta, state: RunState, detail: str) -> RunStatus:
        ended = meta.downed_at if state.is_final else None
        return RunStatus(
            name=meta.name,
            backend=self.name,
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


def _meta_from_plan(
    spec: JobSpec, plan: Plan | None, spot: bool, config: dict[str, Any]
) -> RunMeta:
    meta = RunMeta(
        kind=MANAGED_JOB if spot else CLUSTER,
        name=spec.name,
        nodes=spec.nodes,
        spot=spot,
        launched_at=time.time(),
        ckpt_uri=layout.ckpt_uri(spec.bucket, spec.name) if spec.bucket else None,
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


def _prefixed_lines(chunks: Iterator[str | None], node: int | None) -> Iterator[str]:
    """Re-split SkyPilot's log chunks into lines, prefix them, keep only `node`'s if asked."""
    pending = ""
    for chunk in chunks:
        if chunk is None:
            break
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            yield from _keep(line.rstrip("\r"), node)
    if pending:
        yield from _keep(pending.rstrip("\r"), node)


def _keep(line: str, node: int | None) -> Iterator[str]:
    which, text = prefix_line(_ANSI.sub("", line))
    if node is None or which == node:
        yield text


def _dryrun_choice(cluster_name: str) -> dict[str, str]:
    """Cloud, region and instance type from the provisioning config SkyPilot's dry run wrote."""
    from sky.backends import backend_utils

    try:
        path = Path(backend_utils._get_yaml_path_from_cluster_name(cluster_name) + ".tmp")
        config = yaml.safe_load(path.read_text())
    except (OSError, AttributeError, yaml.YAMLError):  # a private SkyPilot path: best effort
        return {}
    provider = config.get("provider") or {}
    module = str(provider.get("module") or provider.get("type") or "")
    cloud = module.rsplit(".", 1)[-1] if "." in module else None
    chosen = {"cloud": {"lambda_cloud": "lambda"}.get(cloud or "", cloud)}
    chosen["region"] = provider.get("region")
    text = json.dumps(config.get("available_node_types") or {})
    found = re.search(r'"(?:InstanceType|machineType|instance_type)": "([^"/]+)"', text)
    chosen["instance_type"] = found.group(1) if found else None
    return {k: v for k, v in chosen.items() if v}
