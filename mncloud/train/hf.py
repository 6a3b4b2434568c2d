"""`MncloudCallback` for the Hugging Face `Trainer`: its steps in mncloud's telemetry.

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[MncloudCallback()])   # the one line (a cloud run needs it)

On the local backend and in `mncloud profile` every `Trainer` gets one without that line
(`frameworks.imported`). Each optimizer step goes to the run's telemetry through
`mncloud.train.report` (the loss with it once the Trainer logs it): the goodput ledger,
`mncloud metrics`, the summary's steps lost. The start (with the step it resumed from) and the
end are events, from the main process. At the first save, a `--ckpt-dir` run whose
`output_dir` lies outside `$MNCLOUD_CKPT_DIR` is warned in one line (`frameworks.SaveCheck`).
Under `mncloud profile` it hands each step to the profiler (FLOPs and memory of the
Trainer's own step). When made, it sets the trackers up for a resumed attempt: W&B's rewind
and TensorBoard's `purge_step` (`mncloud.train.trackers`).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from mncloud.constants import PROFILE_OUT_ENV
from mncloud.train import mlflowhook, trackers
from mncloud.train.frameworks import SaveCheck, profile_state
from mncloud.train.steptime import event, report


class MncloudCallback(TrainerCallback):
    """Reports the Trainer's steps and events to mncloud (module docstring)."""

    def __init__(self) -> None:
        self.check = SaveCheck("Trainer", "TrainingArguments(output_dir=…)")
        self._profile: Any = None
        self._batch: Any = None
        trackers.rewind_wandb()
        trackers.purge_hf(TensorBoardCallback)
        mlflowhook.install()
        if os.environ.get(PROFILE_OUT_ENV):
            from mncloud.train.profiler import session

            self._profile = session()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.is_world_process_zero:
            event("start", resumed_from=state.global_step, world_size=args.world_size)
            mlflowhook.resumed(state.global_step)
        model = kw.get("model")
        if self._profile is not None and model is not None:
            model.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, _module: Any, args: Any, kwargs: Any) -> None:
        if self._batch is None:
            self._batch = kwargs.get("input_ids", args[0] if args else None)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._profile is not None:
            step_state = profile_state(kw.get("model"), kw.get("optimizer"))
            self._profile.step_started(state.global_step + 1, step_state, self._batch)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        report(state.global_step)
        if self._profile is not None:
            self._profile.step_done(profile_state(kw.get("model"), kw.get("optimizer")))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        if logs and "loss" in logs:
            report(state.global_step, loss=logs["loss"])

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.check.first_save(args.output_dir, state.is_world_process_zero)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.is_world_process_zero:
            event("done", steps=state.global_step)
