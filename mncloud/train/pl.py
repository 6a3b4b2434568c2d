"""`MncloudCallback` for PyTorch Lightning (the `lightning` package): its steps in mncloud's
telemetry.

    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(...), MncloudCallback()])  # the one line

On the local backend and in `mncloud profile` every `lightning` Trainer gets one without that
line (`frameworks.imported`). Each optimizer step (`trainer.global_step`) goes to the run's
telemetry through `mncloud.train.report`, with the step's loss; the start (with the step it
resumed from) and the end are events, from global rank 0. At the first save, a `--ckpt-dir` run
whose checkpoints go outside `$MNCLOUD_CKPT_DIR` (the `ModelCheckpoint`'s `dirpath`, else
`default_root_dir`) is warned in one line. Under `mncloud profile` it hands each step to the
profiler (FLOPs and memory of Lightning's own step).
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch

from mncloud.constants import PROFILE_OUT_ENV
from mncloud.train.frameworks import SaveCheck, profile_state
from mncloud.train.steptime import event, report


class MncloudCallback(pl.Callback):
    """Reports Lightning's steps and events to mncloud (module docstring)."""

    def __init__(self) -> None:
        self.check = SaveCheck("Lightning Trainer", "ModelCheckpoint(dirpath=…)")
        self._profile: Any = None
        if os.environ.get(PROFILE_OUT_ENV):
            from mncloud.train.profiler import session

            self._profile = session()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            event("start", resumed_from=trainer.global_step, world_size=trainer.world_size)

    def _state(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return profile_state(pl_module, trainer.optimizers[0] if trainer.optimizers else None)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._profile is not None:
            step = trainer.global_step + 1
            self._profile.step_started(step, self._state(trainer, pl_module), batch)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        metrics = {"loss": float(loss.detach())} if isinstance(loss, torch.Tensor) else {}
        report(trainer.global_step, **metrics)
        if self._profile is not None:
            self._profile.step_done(self._state(trainer, pl_module))

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        saver = trainer.checkpoint_callback
        path = getattr(saver, "dirpath", None) or trainer.default_root_dir
        self.check.first_save(path, trainer.is_global_zero)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            event("done", steps=trainer.global_step)
