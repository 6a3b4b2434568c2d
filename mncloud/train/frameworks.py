"""What the framework callbacks (`hf.py`, `pl.py`) share: the one-line warning at a framework's
first save outside `--ckpt-dir`, and the model and optimizer `mncloud profile` counts."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from mncloud import constants

log = logging.getLogger(__name__)


class SaveCheck:
    """The one-line warning at a framework's first save when `--ckpt-dir` is set but the
    framework writes elsewhere: those files never reach the bucket and are lost with the node."""

    def __init__(self, framework: str, setting: str) -> None:
        self.framework, self.setting, self.done = framework, setting, False

    def first_save(self, path: str | os.PathLike[str] | None, main: bool) -> str | None:
        """The warning for a save into `path` (logged once, on the main rank), or None."""
        if self.done:
            return None
        self.done = True
        kept = os.environ.get(constants.CKPT_DIR_ENV)
        if not kept or path is None or _inside(Path(path), Path(kept)):
            return None
        line = (
            f"mncloud: --ckpt-dir is {kept} but the {self.framework} saves to {path}: "
            f"those checkpoints are not kept in the bucket and a preemption loses them; "
            f"set {self.setting} to $MNCLOUD_CKPT_DIR"
        )
        if main:
            log.warning(line)
        return line


def _inside(path: Path, folder: Path) -> bool:
    path, folder = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return path == folder or folder in path.parents


def profile_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """What `mncloud profile` counts of a framework's step: its model and optimizer."""
    state: dict[str, Any] = {}
    if isinstance(model, torch.nn.Module):
        state["model"] = model
    if isinstance(optimizer, torch.optim.Optimizer):
        state["optimizer"] = optimizer
    elif optimizer is not None and isinstance(
        getattr(optimizer, "optimizer", None), torch.optim.Optimizer
    ):
        state["optimizer"] = optimizer.optimizer  # accelerate's wrapper
    return state
