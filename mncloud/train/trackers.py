"""What Lightning's loggers do not take from the environment, supplied by `pl.MncloudCallback`
so that every attempt of a run logs into one tracker run (`mncloud.render.trackers` sets the
variables; docs/guides/trackers.md).

- **TensorBoard** (`TensorBoardLogger`, Lightning's default logger): with `MNCLOUD_TB_DIR` set
  (a `--ckpt-dir` run) and no string `version=` of the script's own, it writes to
  `$MNCLOUD_TB_DIR/<run name>` at every attempt (not `lightning_logs/version_N`, a new folder
  per relaunch; Lightning opens that one before any callback runs, so it is left there,
  empty); an attempt resumed from step N opens its writer again with `purge_step=N` (Lightning
  logs optimizer step k + 1 at step k), so TensorBoard drops what the earlier attempts logged
  from there and each step shows once.
- **MLflow** (`MLFlowLogger`): it reads `MLFLOW_TRACKING_URI` but not `MLFLOW_RUN_ID`, and
  opens its run before any callback runs: the site hook gives it the run `up` created
  (`mncloud.train.mlflowhook.joins_the_run`).
- **W&B** (`WandbLogger`) needs nothing: `wandb.init` reads `WANDB_RUN_ID` itself.

Never raises: a logger this cannot adjust is left as the script made it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mncloud import constants

log = logging.getLogger(__name__)


def loggers_of(trainer: Any) -> list[Any]:
    """The Trainer's loggers; empty under `--tracker none`."""
    if os.environ.get(constants.TRACKER_OFF_ENV):
        return []
    return list(getattr(trainer, "loggers", None) or [])


def adopt(trainer: Any) -> None:
    """At `setup`: point the loggers at the run's one tracker run."""
    for logger in loggers_of(trainer):
        try:
            _adopt(logger)
        except Exception as err:  # the training never fails for its tracker
            log.warning("mncloud: %s left as it is: %s", type(logger).__name__, err)


def _adopt(logger: Any) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    tb_dir = os.environ.get(constants.TB_DIR_ENV)
    if isinstance(logger, TensorBoardLogger) and tb_dir and not isinstance(logger._version, str):
        _reopen(logger)  # Lightning opened it before any callback's setup
        logger._root_dir = tb_dir
        logger._name = ""
        logger._version = os.environ.get(constants.RUN_NAME_ENV) or "run"


def rewind(trainer: Any, step: int) -> None:
    """An attempt resumed from optimizer step `step` (its checkpoint's `global_step`, read
    before the first step logs): its TensorBoard writer, opened again with `purge_step`, makes
    TensorBoard drop what the earlier attempts logged past `step`."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in loggers_of(trainer):
        if isinstance(logger, TensorBoardLogger) and step > 0:
            try:
                _reopen(logger)
                logger._kwargs["purge_step"] = step  # Lightning logs step k+1 at k
            except Exception as err:  # the training never fails for its tracker
                log.warning("mncloud: TensorBoard's history not rewound: %s", err)


def _reopen(logger: Any) -> None:
    """Close the logger's writer (only rank 0 has one): the next write opens it anew."""
    writer = getattr(logger, "_experiment", None)
    if writer is not None:
        writer.close()
        logger._experiment = None
