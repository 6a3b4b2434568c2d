"""Each step once in the run's MLflow run (`MLFLOW_RUN_ID`, `mncloud.records.mlflowrun`),
however often the run was resumed: MLflow's API cannot delete a metric's points, so a resumed
attempt does not log again what the run already holds.

The site hook (`mncloud.train.sitehook`) wraps MLflow's one client below every logging call
(`mlflow.log_metric(s)`, `MlflowClient.log_batch`: the Trainer's `MLflowCallback`, Lightning's
`MLFlowLogger`). At an attempt's first metric, the step each key of the run already holds (its
latest point, MLflow's own record) is read once; a point of that key at that step or before is
not sent. So the earlier attempt's points of the redone steps are the ones kept: a resumed
attempt trains those steps again from the same checkpoint, data position and RNG states, so
they are the uninterrupted run's (docs/guides/trackers.md). Runs other than `MLFLOW_RUN_ID`,
and everything under `--tracker none`, are left alone. Never raises into the script.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from mncloud import constants

log = logging.getLogger(__name__)

#: The module whose `TrackingServiceClient` every metric goes through (mlflow 3).
CLIENT_MODULE = "mlflow.tracking._tracking_service.client"
#: The run's tag listing the step each resumed attempt started from (`"4,8"`).
RESUMED_TAG = "mncloud.resumed_from"

#: Per MLflow run id: the step each metric key held when this process first logged to it.
_held: dict[str, dict[str, int]] = {}
#: `MLFLOW_RUN_ID` as this process started with it (`remember_run`).
_process: dict[str, str] = {}


def remember_run() -> None:
    """Keep `MLFLOW_RUN_ID`: `mlflow.start_run()` (the Trainer's `MLflowCallback`) takes it
    out of the environment once it used it."""
    run_id = os.environ.get(constants.MLFLOW_RUN_ID_ENV)
    if run_id:
        _process["run_id"] = run_id


def our_run() -> str | None:
    """The MLflow run mncloud made for this run; None without one, or under `--tracker none`."""
    if os.environ.get(constants.TRACKER_OFF_ENV):
        return None
    return os.environ.get(constants.MLFLOW_RUN_ID_ENV) or _process.get("run_id")


def ours(run_id: str | None) -> bool:
    """Whether `run_id` is the run mncloud made for this run (and trackers are on)."""
    return run_id is not None and run_id == our_run()


def held(client: Any, run_id: str) -> dict[str, int]:
    """The step each metric key of `run_id` holds, read once per process (empty if unread)."""
    if run_id not in _held:
        try:
            metrics = client.get_run(run_id).data._metric_objs
            _held[run_id] = {m.key: int(m.step) for m in metrics}
        except Exception as err:  # the training never fails for its tracker
            log.warning("mncloud: MLflow run %s not read, every step logged: %s", run_id, err)
            _held[run_id] = {}
    return _held[run_id]


def new_points(client: Any, run_id: str, metrics: Iterable[Any]) -> list[Any]:
    """`metrics` less the points the run already holds (key and step at or below its own)."""
    have = held(client, run_id)
    return [m for m in metrics if m.key not in have or int(m.step or 0) > have[m.key]]


def _without_held_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def log_batch(self: Any, run_id: str, metrics: Any = (), *args: Any, **kwargs: Any) -> Any:
        if ours(run_id) and metrics:
            metrics = new_points(self, run_id, metrics)
        return original(self, run_id, metrics, *args, **kwargs)

    log_batch._mncloud = True  # type: ignore[attr-defined]
    return log_batch


def _without_held_metric(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def log_metric(self: Any, run_id: str, key: str, value: Any, *args: Any, **kw: Any) -> Any:
        step = kw.get("step", args[1] if len(args) > 1 else None)
        have = held(self, run_id) if ours(run_id) else {}
        if key in have and int(step or 0) <= have[key]:
            return None
        return original(self, run_id, key, value, *args, **kw)

    log_metric._mncloud = True  # type: ignore[attr-defined]
    return log_metric


def imported(module: Any) -> None:
    """Wrap `module.TrackingServiceClient`'s `log_batch` and `log_metric` (once)."""
    remember_run()
    cls = module.TrackingServiceClient
    if getattr(cls.log_batch, "_mncloud", False):
        return
    cls.log_batch = _without_held_batch(cls.log_batch)
    cls.log_metric = _without_held_metric(cls.log_metric)


def install() -> None:
    """Wrap MLflow's client where no site hook runs (a cloud node): called when mncloud's
    Trainer or Lightning callback is made, before either trainer logs a metric. Only for a
    run with an MLflow run of mncloud's, where mlflow is installed."""
    if our_run() is None or importlib.util.find_spec("mlflow") is None:
        return
    try:
        from mlflow.tracking._tracking_service import client  # CLIENT_MODULE

        imported(client)
    except Exception as err:  # the training never fails for its tracker
        log.warning("mncloud: MLflow's client left as it is, redone steps logged again: %s", err)


def joins_the_run(logger_cls: type) -> None:
    """Lightning's `MLFlowLogger` reads `MLFLOW_TRACKING_URI` but not `MLFLOW_RUN_ID`, and
    opens its run before any callback runs: a logger made without a `run_id=` of the script's
    own gets the run's (`MLFLOW_RUN_ID`) when it is made."""
    if getattr(logger_cls.__init__, "_mncloud", False):
        return
    original = logger_cls.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        run_id = our_run()
        if kwargs.get("run_id") is None and len(args) <= _RUN_ID_AT and run_id:
            kwargs["run_id"] = run_id
        original(self, *args, **kwargs)

    init._mncloud = True  # type: ignore[attr-defined]
    logger_cls.__init__ = init  # type: ignore[method-assign]


#: `run_id`'s place among `MLFlowLogger`'s positional parameters (after `self`).
_RUN_ID_AT = 8


def resumed(step: int) -> None:
    """An attempt resumed from optimizer step `step` (rank 0, before its first step): the step
    added to the run's `mncloud.resumed_from` tag. Only where the script uses MLflow."""
    run_id = our_run()
    if step <= 0 or run_id is None or "mlflow" not in sys.modules:
        return
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        before = client.get_run(run_id).data.tags.get(RESUMED_TAG)
        client.set_tag(run_id, RESUMED_TAG, ",".join(filter(None, [before, str(step)])))
    except Exception as err:  # the training never fails for its tracker
        log.warning("mncloud: MLflow run %s not tagged: %s", run_id, err)
