"""The trainers people already use, unchanged: what mncloud's site hook adds to them.

`imported(name, module)` is called once a watched module finished importing (the post-import
hook of `templates/sitecustomize.py.j2`, first on the workers' `PYTHONPATH` on the local
backend and in `mncloud profile`, never on a cloud: `layout.site_hook_source`):

    transformers.trainer  every `Trainer(...)` gets `hf.MncloudCallback`
    transformers.training_args
                          on a CPU-only node under torchrun, `use_cpu` (the Trainer joins
                          the processes only on an accelerator or with it; without, each
                          process trains alone: run_clm.py on `--cloud local`)
    lightning.pytorch     every `Trainer(...)` gets `pl.MncloudCallback`; an `MLFlowLogger`
                          made without a run id joins the run's (`MLFLOW_RUN_ID`)
    wandb                 on a resumed attempt, `wandb.init` rewinds the run
                          (`trackers.rewind_wandb`, which both callbacks call when made)
    torchtitan.*          its trainer's steps reported; on a CPU-only node what it needs
                          there (`titan.py`); `importing(name)` runs around those imports
    mlflow's client       a resumed attempt does not log again the steps the run's MLflow
                          run already holds (`mlflowhook.py`)

A callback the script passed itself (the one line a cloud run needs) is not added twice.
The hook also lets `torch.load` restore onto `cpu:0` (the Trainer's `map_location` on a
CPU-only multi-process run, which torch refuses) by itself: that needs nothing of mncloud.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

from mncloud.train import mlflowhook, titan, trackers

#: The modules `imported` acts on (the site hook watches these, and torch).
WATCHED = (
    "transformers.trainer",
    "transformers.training_args",
    "lightning.pytorch",
    "wandb",
    mlflowhook.CLIENT_MODULE,
    *titan.PATCHED,
    *titan.NEEDS_TRITON,
)


def with_callback(trainer_cls: type, make: Callable[[], Any], kind: type) -> None:
    """Make every `trainer_cls(...)` carry one `kind` callback (`make()`), added to its
    `callbacks=` unless the script gave one itself."""
    if getattr(trainer_cls.__init__, "_mncloud", False):
        return
    original = trainer_cls.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        given = list(kwargs.get("callbacks") or [])
        if not any(isinstance(c, kind) for c in given):
            kwargs["callbacks"] = [*given, make()]
        original(self, *args, **kwargs)

    init._mncloud = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = init  # type: ignore[method-assign]


def processes_train_together(args_cls: type) -> None:
    """`TrainingArguments(...)` on a node torch sees no CUDA device on, under a launcher of 2+
    processes (`WORLD_SIZE`): `use_cpu=True`, so the Trainer trains them as one job (gloo), as
    it does on GPUs by itself; it otherwise trains each process alone, silently."""
    if getattr(args_cls.__post_init__, "_mncloud", False):
        return
    original = args_cls.__post_init__

    @functools.wraps(original)
    def post_init(self: Any) -> None:
        import torch

        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
            self.use_cpu = True
        original(self)

    post_init._mncloud = True  # type: ignore[attr-defined]
    args_cls.__post_init__ = post_init  # type: ignore[method-assign]


def importing(name: str) -> contextlib.AbstractContextManager[None]:
    """Entered while `name` (one of `WATCHED`) imports."""
    return titan.importing(name) if name in titan.NEEDS_TRITON else contextlib.nullcontext()


def imported(name: str, module: Any) -> None:
    """Called once `name` (one of `WATCHED`) finished importing as `module`."""
    if name in titan.PATCHED:
        titan.imported(name, module)
    elif name == mlflowhook.CLIENT_MODULE:
        mlflowhook.imported(module)
    elif name == "transformers.training_args":
        processes_train_together(module.TrainingArguments)
    elif name == "transformers.trainer":
        from mncloud.train.hf import MncloudCallback

        with_callback(module.Trainer, MncloudCallback, MncloudCallback)
    elif name == "wandb":
        trackers.rewind_wandb()
    elif name == "lightning.pytorch":
        from mncloud.train.pl import MncloudCallback as LightningCallback

        with_callback(module.Trainer, LightningCallback, LightningCallback)
        mlflowhook.joins_the_run(module.loggers.MLFlowLogger)
