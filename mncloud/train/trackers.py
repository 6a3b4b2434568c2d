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
- **W&B** (`WandbLogger`, the HF Trainer's `WandbCallback`, a plain `wandb.init`): it reads
  `WANDB_RUN_ID` itself. An attempt that resumes from a `--ckpt-dir` unit of step N
  (`$MNCLOUD_RESUME_FROM`, the step in the unit's name) rewinds it (`rewind_wandb`).
- **TensorBoard, HF Trainer** (`TensorBoardCallback`): it writes to `TENSORBOARD_LOGGING_DIR`
  (set to `MNCLOUD_TB_DIR`); a resumed `train` opens its writer with `purge_step` (`purge_hf`).

Never raises: a logger this cannot adjust is left as the script made it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mncloud import constants
from mncloud.storage.frameworkdirs import entry_step

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


def flush(trainer: Any) -> None:
    """At a checkpoint save: the TensorBoard writers' buffered events onto the disk, so that
    the `--ckpt-dir` sync sends them before the checkpoint (a resume from it finds its steps
    in the bucket; the writer otherwise keeps up to 10 events or 2 minutes in memory)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in loggers_of(trainer):
        writer = getattr(logger, "_experiment", None)
        if isinstance(logger, TensorBoardLogger) and writer is not None:
            try:
                writer.flush()
            except Exception as err:  # the training never fails for its tracker
                log.warning("mncloud: TensorBoard's events not flushed: %s", err)


def _reopen(logger: Any) -> None:
    """Close the logger's writer (only rank 0 has one): the next write opens it anew."""
    writer = getattr(logger, "_experiment", None)
    if writer is not None:
        writer.close()
        logger._experiment = None


def resumed_step(env: Mapping[str, str]) -> int | None:
    """The step of the `--ckpt-dir` unit this attempt resumes from (`$MNCLOUD_RESUME_FROM`'s
    name: `checkpoint-40`, `epoch=4-step=40.ckpt`); None on a first attempt or a name without
    one (`last.ckpt`)."""
    unit = env.get(constants.RESUME_FROM_ENV)
    return entry_step(Path(unit).name) if unit else None


def wandb_moment(env: Mapping[str, str]) -> str | None:
    """W&B's rewind of this attempt, `<run id>?_step=<rows − 1>`: W&B numbers its history's
    rows from 0, one per `log` call, so the history keeps the rows logged up to step N and the
    next row follows them. The rows are counted from the unit's `trainer_state.json` (the HF
    Trainer logs one row per entry of its `log_history`, whatever `logging_steps`); without
    one, one row per step (N). None when no rewind is due: a first attempt, `--tracker none`,
    no W&B id, or a `WANDB_RESUME` other than mncloud's."""
    step = resumed_step(env)
    run_id = env.get(constants.WANDB_RUN_ID_ENV)
    if env.get(constants.TRACKER_OFF_ENV) or not step or not run_id:
        return None
    if env.get(constants.WANDB_RESUME_ENV) != "allow":
        return None
    rows = _rows_logged(Path(env[constants.RESUME_FROM_ENV]), step)
    return f"{run_id}?_step={rows - 1}" if rows else None


#: A Lightning checkpoint's key for the W&B rows logged up to it (`logged_rows`).
WANDB_ROWS_KEY = "mncloud_wandb_rows"


def _rows_logged(unit: Path, step: int) -> int:
    """How many W&B rows the run logged up to `step`: as a Lightning checkpoint file holds it
    (`WANDB_ROWS_KEY`), the entries of the HF Trainer's `log_history` (`trainer_state.json`
    in the unit) at or before it, else `step` (one row per step)."""
    if unit.suffix == ".ckpt" and (rows := _rows_in_checkpoint(unit)):
        return rows
    try:
        history = json.loads((unit / "trainer_state.json").read_text())["log_history"]
    except (OSError, ValueError, KeyError, TypeError):
        return step
    return sum(1 for entry in history if int(entry.get("step", 0)) <= step)


def _rows_in_checkpoint(unit: Path) -> int | None:
    """`WANDB_ROWS_KEY` of Lightning checkpoint `unit`, its tensors memory-mapped (not read)."""
    try:
        import torch

        held = torch.load(unit, map_location="cpu", mmap=True, weights_only=False)
    except Exception:  # not a checkpoint torch reads like this: one row per step
        return None
    rows = held.get(WANDB_ROWS_KEY) if isinstance(held, dict) else None
    return rows if isinstance(rows, int) and rows > 0 else None


def rewind_wandb() -> None:
    """On an attempt resumed from step N (`wandb_moment`), make the process's first
    `wandb.init` of this run rewind it to N (`resume_from`) instead of resuming it at its end.

    W&B refuses `resume` and `resume_from` together, and Lightning's `WandbLogger` passes
    `resume="allow"`: so mncloud's `WANDB_RESUME=allow` leaves the environment and goes into
    the calls, and the first call with no id or this run's id and no `resume` but `allow` gets
    `resume_from` in its place. A call the rewind fails for is made again as it was."""
    if importlib.util.find_spec("wandb") is None:
        return  # (before `wandb_moment`, which may read the checkpoint's row count)
    moment = wandb_moment(os.environ)
    if moment is None:
        return
    import wandb

    if getattr(wandb.init, "_mncloud", False):
        return
    os.environ.pop(constants.WANDB_RESUME_ENV, None)
    wandb.init = _rewinding(wandb.init, moment)


def logged_rows(trainer: Any, at_batch_end: bool) -> int | None:
    """At a Lightning save: how many W&B rows hold the steps up to it, the process's W&B run's
    row count (`run.step`), and the row Lightning logs for this batch after a save made at
    its end (`on_train_batch_end` comes before the batch's metrics are logged); None without
    a W&B run."""
    run = getattr(sys.modules.get("wandb"), "run", None)
    if run is None or os.environ.get(constants.TRACKER_OFF_ENV):
        return None
    try:
        logs = bool(at_batch_end and trainer._logger_connector.should_update_logs)
        return int(run.step) + logs
    except Exception:  # a Lightning or W&B without these: one row per step, as before
        return None


def _rewinding(init: Any, moment: str) -> Any:
    """`init` (W&B's) whose first call of run `moment`'s id rewinds it to `moment`."""
    run_id = moment.split("?", 1)[0]
    due = [moment]

    @functools.wraps(init)
    def rewound(*args: Any, **kwargs: Any) -> Any:
        ours = kwargs.get("id") in (None, run_id) and kwargs.get("resume") in (None, "allow")
        plain = {**kwargs, "resume": kwargs.get("resume") or "allow"}
        if not (due and ours) or kwargs.get("resume_from") or kwargs.get("fork_from"):
            return init(*args, **plain)
        due.clear()
        try:
            return init(*args, **{**kwargs, "resume": None, "resume_from": moment})
        except Exception as err:  # the training never fails for its tracker
            log.warning("mncloud: W&B's history not rewound to %s: %s", moment, err)
            return init(*args, **plain)

    rewound._mncloud = True  # type: ignore[attr-defined]
    return rewound


def purge_hf(callback_cls: type) -> None:
    """Make the HF Trainer's `TensorBoardCallback` (`callback_cls`) open its writer, on a
    `train` resumed from step N (`state.global_step` at `on_train_begin`), with
    `purge_step=N + 1`: the Trainer logs step N + 1 first, so TensorBoard drops what the
    earlier attempts logged from there on and each step shows once. A writer the script gave
    it is left alone."""
    if getattr(callback_cls.on_train_begin, "_mncloud", False):
        return
    original = callback_cls.on_train_begin

    @functools.wraps(original)
    def on_train_begin(self: Any, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        make = getattr(self, "_SummaryWriter", None)
        if os.environ.get(constants.TRACKER_OFF_ENV) or self.tb_writer is not None or not make:
            return original(self, args, state, control, **kw)
        if state.global_step > 0:
            self._SummaryWriter = functools.partial(make, purge_step=state.global_step + 1)
        try:
            return original(self, args, state, control, **kw)
        finally:
            self._SummaryWriter = make

    on_train_begin._mncloud = True  # type: ignore[attr-defined]
    callback_cls.on_train_begin = on_train_begin  # type: ignore[attr-defined]
