"""A run's tracker runs as mncloud shows them and tells them (docs/guides/trackers.md).

`tracker_links(record)`: the link of each tracker run the run logs into, from what its record
holds (the spec's `--env`, which `up` completed: `mlflowrun.with_mlflow_run`). `status`, the
end-of-run summary and the web view show these; nothing is shown for a tracker whose link is
not known (a W&B run without `WANDB_ENTITY` and `WANDB_PROJECT`). No user name, password or
token is ever part of a link.

`post_figures(record)`: at the end of each attempt (a preemption, a failure, the finish),
mncloud's own figures go to the run's MLflow run over its REST API, as tags (the newest) and
as metrics at step = the attempt's number (one point per attempt):

    mncloud.cost_usd      cost so far (`ledger.cost_summary`)
    mncloud.goodput       useful ÷ billed node-seconds (`goodput.goodput_ledger`), when known
    mncloud.restarts      relaunches so far (after a preemption, an error, an outage)
    mncloud.preemptions   preemptions so far
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

from mncloud import constants, layout
from mncloud.records import mlflowrun
from mncloud.records.model import RunRecord
from mncloud.spec import Tracker

#: The figure names, as tags and metrics of the MLflow run.
FIGURES = ("mncloud.cost_usd", "mncloud.goodput", "mncloud.restarts", "mncloud.preemptions")


def tracker_links(record: RunRecord) -> dict[str, str]:
    """Each tracker's run link (`{"MLflow": url, "W&B": url}`), only those known."""
    envs: Mapping[str, str] = record.spec.get("envs") or {}
    if record.spec.get("tracker") == Tracker.NONE.value:
        return {}
    links = {}
    uri, mlflow_id = _mlflow_of(envs)
    experiment = envs.get(constants.MLFLOW_EXPERIMENT_ID_ENV)
    if uri and mlflow_id and experiment and uri.startswith(("http://", "https://")):
        base = mlflowrun.shown(uri).split("?", 1)[0].rstrip("/")
        links["MLflow"] = f"{base}/#/experiments/{experiment}/runs/{mlflow_id}"
    wandb = _wandb_link(record, envs)
    if wandb:
        links["W&B"] = wandb
    return {k: v for k, v in links.items() if v.startswith(("http://", "https://"))}


def _mlflow_of(envs: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The run's MLflow server and run id, as its record holds them."""
    return envs.get(constants.MLFLOW_TRACKING_URI_ENV), envs.get(constants.MLFLOW_RUN_ID_ENV)


def _wandb_link(record: RunRecord, envs: Mapping[str, str]) -> str | None:
    """The W&B run's page (under node recovery, its group's), when entity and project are set."""
    from mncloud.records.wandbfigures import wandb_names

    entity, project = envs.get("WANDB_ENTITY"), envs.get("WANDB_PROJECT")
    if not entity or not project:
        return None
    api = mlflowrun.shown(envs.get("WANDB_BASE_URL") or "https://api.wandb.ai").rstrip("/")
    app = api.replace("://api.", "://", 1)
    group, run = wandb_names(record, envs)
    if group is not None:
        return f"{app}/{entity}/{project}/groups/{group}"
    return f"{app}/{entity}/{project}/runs/{run}"


def figures(record: RunRecord, ckpt_uri: str | None = None) -> dict[str, float]:
    """mncloud's figures of the run so far (module docstring); `ckpt_uri`: where its ranks'
    telemetry is when the record does not say (a local run's own folder)."""
    from mncloud.records.goodput import Telemetry, goodput_ledger, series_marks
    from mncloud.records.ledger import cost_summary
    from mncloud.telemetry.series import read_summary

    cost = cost_summary(record)
    out = {"mncloud.cost_usd": round(cost.total, 4), "mncloud.restarts": float(cost.restarts),
           "mncloud.preemptions": float(cost.preemptions)}  # fmt: skip
    uri = record.ckpt_uri or ckpt_uri
    try:
        series = read_summary(layout.series_uri(uri, record.run_id), metrics=False) if uri else None
        steps = series_marks(series) if series is not None and series.steps else None
        ledger = goodput_ledger(record, Telemetry(steps=steps))
    except Exception:  # a figure never stops the others: goodput left out
        return out
    if ledger.goodput is not None:
        out["mncloud.goodput"] = round(ledger.goodput, 4)
    return out


def post_figures(record: RunRecord, ckpt_uri: str | None = None) -> list[str]:
    """Send `figures(record)` to the run's MLflow run and W&B run (`wandbfigures`), those it
    has; one warning line per tracker that did not take them (never raises)."""
    if record.spec.get("tracker") == Tracker.NONE.value:
        return []
    # Read (the ledger, the ranks' series in the bucket) once, and only for a tracker run.
    values = functools.cache(lambda: figures(record, ckpt_uri))
    warnings = []
    for tracker, send in (("MLflow", _to_mlflow), ("W&B", _to_wandb)):
        try:
            send(record, values)
        except Exception as err:  # the training never fails for its tracker
            warnings.append(f"warning: mncloud's figures not sent to {tracker} ({_line(err)})")
    return warnings


def _to_mlflow(record: RunRecord, figures_of: Callable[[], dict[str, float]]) -> None:
    uri, mlflow_id = _mlflow_of(record.spec.get("envs") or {})
    if not uri or not mlflow_id:
        return
    values = figures_of()
    now, attempt = int(time.time() * 1000), int(values["mncloud.restarts"]) + 1
    body = {
        "run_id": mlflow_id,
        "metrics": [{"key": k, "value": v, "timestamp": now, "step": attempt}
                    for k, v in values.items()],
        "tags": [{"key": k, "value": f"{v:g}"} for k, v in values.items()],
    }  # fmt: skip
    try:
        mlflowrun.call(uri, "runs/log-batch", body)
    except Exception as err:
        raise RuntimeError(f"{mlflowrun.shown(uri)}: {_line(err)}") from err


def _to_wandb(record: RunRecord, figures_of: Callable[[], dict[str, float]]) -> None:
    from mncloud.records import wandbfigures

    wandbfigures.post(record, figures_of)


def _line(err: BaseException) -> str:
    """`err` in one line, with no credential in it."""
    from mncloud.redact import redactor_for

    said = " ".join(str(err).split()) or type(err).__name__
    return redactor_for().scrub(said)
