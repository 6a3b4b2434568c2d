"""`MncloudCallback` for PyTorch Lightning (the `lightning` package): its steps in mncloud's
telemetry, a world that does not match the launcher's refused, and every rank's RNG states
kept in the checkpoint.

    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(...), MncloudCallback()])  # the one line

On the local backend and in `mncloud profile` every `lightning` Trainer gets one without that
line (`sitehook.imported`).

- **Steps.** Each optimizer step (`trainer.global_step`) goes to the run's telemetry through
  `mncloud.train.report`, with the step's loss; the start (with the step it resumed from) and
  the end are events, from global rank 0. Under `mncloud profile` it hands each step to the
  profiler (FLOPs and memory of Lightning's own step).
- **The world.** At `fit`'s setup, before anything trains, a Trainer whose world
  (`num_nodes × devices`) is not the launcher's `WORLD_SIZE` is refused on every rank
  (`WorldMismatch`, mncloud's refusal: one line, the run fails, not retried). Lightning
  itself says nothing: with `num_nodes` left at 1 on 2 nodes each node trains alone, on the
  whole data set.
- **RNG states.** Every save gathers each rank's Python, NumPy, torch CPU and CUDA RNG states
  (Lightning's own `_collect_rng_states`) into the checkpoint (`RNG_KEY`, a list by global
  rank; plain lists and tensors, so a `weights_only` load reads it); a resumed `fit` puts
  each rank's own back, so dropout draws what the run that never stopped drew. A checkpoint
  without them, or of another world size, restores none (said once, from rank 0). Exact
  only from a checkpoint taken where Lightning resumes the data exactly: at an epoch's end.
- **Trackers.** At `fit`'s setup its loggers are pointed at the run's one tracker run, and
  a resumed `fit` rewinds its TensorBoard history to the step it resumed from; W&B's is
  rewound from the callback's making on, before Lightning opens the W&B run
  (`mncloud.train.trackers`).
- **Saves outside `--ckpt-dir`.** At the first save, a `--ckpt-dir` run whose checkpoints go
  outside `$MNCLOUD_CKPT_DIR` (the `ModelCheckpoint`'s `dirpath`, else `default_root_dir`) is
  warned in one line.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.trainer.states import TrainerFn

from mncloud.constants import PROFILE_OUT_ENV, SKYPILOT_NUM_NODES
from mncloud.train import mlflowhook, trackers
from mncloud.train.frameworks import SaveCheck, profile_state
from mncloud.train.state import Refusal
from mncloud.train.steptime import event, report

log = logging.getLogger(__name__)

#: The checkpoint's entry for the RNG states: one dict per global rank, in rank order.
RNG_KEY = "mncloud_rng_states"


class WorldMismatch(Refusal):
    """Lightning's world is not the processes the launcher started (`world_mismatch`)."""


class MncloudCallback(pl.Callback):
    """Reports Lightning's steps and events to mncloud, refuses a world that does not match
    the launcher's and keeps every rank's RNG states in the checkpoint (module docstring)."""

    def __init__(self) -> None:
        self.check = SaveCheck("Lightning Trainer", "ModelCheckpoint(dirpath=…)")
        self._profile: Any = None
        self._at_batch_end = False  # a save now comes before this batch's metrics are logged
        trackers.rewind_wandb()
        mlflowhook.install()
        mlflowhook.joins_the_run(pl.loggers.MLFlowLogger)  # one made after this joins the run
        if os.environ.get(PROFILE_OUT_ENV):
            from mncloud.train.profiler import session

            self._profile = session()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == TrainerFn.FITTING:
            trackers.adopt(trainer)
        line = world_mismatch(trainer) if stage == TrainerFn.FITTING else None
        if line is not None:  # every rank: each may be a world of its own, so no collective
            if os.environ.get("RANK", "0") == "0":
                log.error("%s", line)
            err = WorldMismatch(line)
            err.leave_marker()
            raise err

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            event("start", resumed_from=trainer.global_step, world_size=trainer.world_size)
            mlflowhook.resumed(trainer.global_step)

    def _state(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return profile_state(pl_module, trainer.optimizers[0] if trainer.optimizers else None)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._at_batch_end = False
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
        self._at_batch_end = True  # ModelCheckpoint's save (callbacks come last) is next

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._at_batch_end = False  # the batch's metrics were logged before validation

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._at_batch_end = False

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        saver = trainer.checkpoint_callback
        path = getattr(saver, "dirpath", None) or trainer.default_root_dir
        self.check.first_save(path, trainer.is_global_zero)
        checkpoint[RNG_KEY] = every_ranks_rng_states()
        rows = trackers.logged_rows(trainer, self._at_batch_end)
        if rows is not None:
            checkpoint[trackers.WANDB_ROWS_KEY] = rows  # a resume rewinds W&B to them
        trackers.flush(trainer)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if (
            trainer.state.fn != TrainerFn.FITTING
        ):  # an evaluation draws nothing that training continues
            return
        trackers.rewind(trainer, int(checkpoint.get("global_step", 0)))
        states = checkpoint.get(RNG_KEY)
        if not isinstance(states, list) or len(states) != trainer.world_size:
            if trainer.is_global_zero:
                log.warning("mncloud: %s", _not_restored(states, trainer.world_size))
            return
        set_rng_states(states[trainer.global_rank])

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            event("done", steps=trainer.global_step)


def world_mismatch(trainer: pl.Trainer) -> str | None:
    """The one line refusing a `fit` whose Lightning world (`num_nodes × devices`) is not the
    launcher's `WORLD_SIZE` (None: they agree, or no launcher set one)."""
    started = os.environ.get("WORLD_SIZE")
    nodes, devices = trainer.num_nodes, trainer.num_devices
    if not started or not started.isdigit() or nodes * devices == int(started):
        return None
    world = nodes * devices
    alone = nodes == 1 and world < int(started)
    why = "each node would train alone" if alone else "they would not train as one"
    return (
        f"Lightning's world is {_count(nodes, 'node')} × {_count(devices, 'device')} = "
        f"{_count(world, 'process', 'es')} but torchrun started {started} (WORLD_SIZE): "
        f'{why}; pass L.Trainer(num_nodes=int(os.environ["{SKYPILOT_NUM_NODES}"]), '
        f'devices=int(os.environ["LOCAL_WORLD_SIZE"]))'
    )


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{'' if n == 1 else plural}"


def every_ranks_rng_states() -> list[dict[str, Any]]:
    """This process's RNG states and, in a process group, every rank's (gathered: Lightning
    builds the checkpoint on every rank and only rank 0 writes it), in rank order."""
    own = _collect_rng_states(include_cuda=torch.cuda.is_available())
    if "numpy" in own:  # its key as a list: a `weights_only` load refuses NumPy arrays
        name, key, pos, has_gauss, gauss = own["numpy"]
        own["numpy"] = (name, key.tolist(), int(pos), int(has_gauss), float(gauss))
    if not (dist.is_available() and dist.is_initialized()):
        return [own]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, own)
    return states


def set_rng_states(state: dict[str, Any]) -> None:
    """Put back one rank's states (`every_ranks_rng_states`); CUDA's only onto as many
    devices as it was saved from."""
    state = dict(state)
    cuda = state.get("torch.cuda")
    if cuda is not None and (
        not torch.cuda.is_available() or len(cuda) != torch.cuda.device_count()
    ):
        del state["torch.cuda"]
    _set_rng_states(state)


def _not_restored(states: Any, world: int) -> str:
    why = (
        "the checkpoint holds no RNG states (saved without mncloud's callback)"
        if not isinstance(states, list)
        else f"the checkpoint's RNG states are of {len(states)} ranks, this run has {world}"
    )
    return f"{why}: not restored; random draws such as dropout go on from fresh states"
