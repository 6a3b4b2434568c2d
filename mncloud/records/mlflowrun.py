"""The one MLflow run of a training run, created at `up` when `MLFLOW_TRACKING_URI` is set.

Every rank of every attempt then gets its id as `MLFLOW_RUN_ID`, which MLflow's client (and
the Trainer's `MLflowCallback`, Lightning's `MLFlowLogger` through `mlflow.start_run`) resumes
instead of starting a run of its own. The run is created over MLflow's REST API with the
standard library (the CLI needs no `mlflow` package), tagged with mncloud's run id, cloud, GPUs
and git commit. A server that does not answer costs one warning line: the run goes on
without the tracker run (`MLFLOW_RUN_ID` unset).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from mncloud import constants
from mncloud.errors import MncloudError
from mncloud.records.lineage import git, repo_root
from mncloud.records.model import RecordError
from mncloud.redact import looks_like_credential
from mncloud.spec import JobSpec, Tracker

#: Seconds `up` waits on the tracking server for each request (`$MNCLOUD_MLFLOW_TIMEOUT_S`).
TIMEOUT_S = 10.0
TIMEOUT_ENV = "MNCLOUD_MLFLOW_TIMEOUT_S"
#: The tags every run carries (besides MLflow's own `mlflow.source.git.commit`).
TAG_RUN_ID, TAG_CLOUD, TAG_GPUS, TAG_NODES = (
    "mncloud.run_id",
    "mncloud.cloud",
    "mncloud.gpus",
    "mncloud.nodes",
)
_API = "/api/2.0/mlflow"


class TrackerUnreachable(Exception):
    """The tracking server did not answer, or answered with an error (its one line)."""


def tracking_uri(spec: JobSpec) -> str | None:
    """`MLFLOW_TRACKING_URI` from `--env`, else the user's environment; None: not set, or not
    a server (`file:`, `databricks`, … are the client's, not reachable from `up`)."""
    uri = spec.envs.get(constants.MLFLOW_TRACKING_URI_ENV) or os.environ.get(
        constants.MLFLOW_TRACKING_URI_ENV
    )
    return uri if uri and uri.startswith(("http://", "https://")) else None


def with_mlflow_run(
    spec: JobSpec, run_id: str, warn: Callable[[str], None], resume: bool = False
) -> JobSpec:
    """`spec` with `MLFLOW_RUN_ID`, its experiment and the tracking URI in its `--env`: with
    `resume` (`up --resume`) the MLflow run of the run's newest record (`earlier_run`) while
    the server still has it, else a run created for `run_id`; `spec` unchanged when the
    tracker is off, the user chose a run, no server is set, or the server did not answer
    (`warn`ed)."""
    uri = tracking_uri(spec)
    if spec.tracker is Tracker.NONE or uri is None or constants.MLFLOW_RUN_ID_ENV in spec.envs:
        return spec
    earlier = earlier_run(spec.name) if resume else None
    try:
        info = run_info(uri, earlier) if earlier is not None else None
        info = info or create_run(uri, spec, run_id)
    except TrackerUnreachable as err:
        warn(f"warning: MLflow at {shown(uri)} did not answer ({err}); training without it")
        return spec
    envs = {**spec.envs, constants.MLFLOW_RUN_ID_ENV: str(info["run_id"])}
    envs.setdefault(constants.MLFLOW_EXPERIMENT_ID_ENV, str(info["experiment_id"]))
    if not looks_like_credential(constants.MLFLOW_TRACKING_URI_ENV, uri):
        # A cloud node has no user env; the record keeps it for the run's link (`trackers`).
        envs.setdefault(constants.MLFLOW_TRACKING_URI_ENV, uri)
    return spec.updated(envs=envs)


def earlier_run(name: str) -> str | None:
    """The MLflow run of run `name`'s newest record on this machine (`up --resume` logs into
    it again), if it had one."""
    from mncloud.records.store import load_current

    try:
        envs = load_current(name).spec.get("envs") or {}
    except MncloudError:
        return None
    found = envs.get(constants.MLFLOW_RUN_ID_ENV)
    return str(found) if found else None


def run_info(uri: str, mlflow_id: str) -> dict[str, Any] | None:
    """Run `mlflow_id`'s info (`run_id`, `experiment_id`, …); None when the server does not
    hold it, or holds it deleted."""
    query = urllib.parse.urlencode({"run_id": mlflow_id})
    try:
        info: dict[str, Any] = call(uri, f"runs/get?{query}")["run"]["info"]
    except TrackerUnreachable as err:
        if "RESOURCE_DOES_NOT_EXIST" in str(err):
            return None
        raise
    return None if info.get("lifecycle_stage") == "deleted" else info


def create_run(uri: str, spec: JobSpec, run_id: str) -> dict[str, Any]:
    """Create the MLflow run of `run_id` in `MLFLOW_EXPERIMENT_NAME` (else the default
    experiment) with mncloud's tags; its info (`run_id`, `experiment_id`, …)."""
    experiment = spec.envs.get(constants.MLFLOW_EXPERIMENT_NAME_ENV) or os.environ.get(
        constants.MLFLOW_EXPERIMENT_NAME_ENV
    )
    tags = {
        TAG_RUN_ID: run_id,
        TAG_CLOUD: ",".join(spec.clouds) or "any",
        TAG_GPUS: str(spec.accelerator),
        TAG_NODES: str(spec.nodes),
        "mlflow.runName": run_id,
    }
    commit = _commit(spec)
    if commit:
        tags["mlflow.source.git.commit"] = commit
    body = {
        "experiment_id": experiment_id(uri, experiment) if experiment else "0",
        "run_name": run_id,
        "start_time": int(time.time() * 1000),
        "tags": [{"key": k, "value": v} for k, v in tags.items()],
    }
    info: dict[str, Any] = call(uri, "runs/create", body)["run"]["info"]
    return info


def experiment_id(uri: str, name: str) -> str:
    """The id of experiment `name`, created when missing."""
    query = urllib.parse.urlencode({"experiment_name": name})
    try:
        found = call(uri, f"experiments/get-by-name?{query}")
        return str(found["experiment"]["experiment_id"])
    except TrackerUnreachable as err:
        if "RESOURCE_DOES_NOT_EXIST" not in str(err):
            raise
    return str(call(uri, "experiments/create", {"name": name})["experiment_id"])


def call(uri: str, endpoint: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One REST call (`body`: POST, else GET); its JSON answer."""
    url = f"{shown(uri).rstrip('/')}{_API}/{endpoint}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    auth = _authorization(uri)
    if auth:
        request.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(request, timeout=_timeout()) as answer:
            return json.loads(answer.read() or b"{}")  # type: ignore[no-any-return]
    except urllib.error.HTTPError as err:
        detail: Any = None
        with contextlib.suppress(Exception):
            detail = json.loads(err.read())
        if isinstance(detail, dict) and detail.get("error_code"):
            raise TrackerUnreachable(f"{detail['error_code']}: {detail.get('message')}") from None
        raise TrackerUnreachable(f"HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise TrackerUnreachable(getattr(reason, "strerror", None) or str(reason)) from None


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV) or TIMEOUT_S)
    except ValueError:
        return TIMEOUT_S


def _authorization(uri: str) -> str | None:
    """MLflow's client's own: a token (`MLFLOW_TRACKING_TOKEN`), else basic auth from the
    URI's user and password or `MLFLOW_TRACKING_USERNAME` / `_PASSWORD`."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return f"Bearer {token}"
    parts = urllib.parse.urlsplit(uri)
    user = parts.username or os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = parts.password or os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not user or password is None:
        return None
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return f"Basic {base64.b64encode(pair).decode()}"


def _commit(spec: JobSpec) -> str | None:
    root = repo_root(spec.workdir)
    if root is None:
        return None
    try:
        return str(git(root, "rev-parse", "--verify", "HEAD")) or None
    except RecordError:
        return None


def shown(uri: str) -> str:
    """The URI without any user or password in it."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))
