"""What a checkpoint holds of a training state, and how it goes back in place.

A state is the dict a script passes to `CheckpointManager`: models, optimizers and tensors go
to DCP (sharded, `tensor_state`); everything else is a per-rank extra (`split_state`): an
object with `state_dict`/`load_state_dict` (a sampler) by its state dict, any other value as
is, and the process's RNG states under their own key. `restore_state` loads both back, the RNG
states last.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from mncloud.constants import REFUSED_MARKER_ENV
from mncloud.errors import CheckpointError
from mncloud.storage.shapes import shape_mismatch

log = logging.getLogger(__name__)

#: DCP's warning when it runs without a process group (one process): expected, not news.
NO_DIST_WARNING = "torch.distributed is disabled, unavailable"

_RNG_KEY = "__rng__"
_VALUE, _STATEFUL = "value", "stateful"


class Refusal(SystemExit):
    """A load that must not be retried, with one line saying why: nothing is loaded.
    Uncaught, it ends the process with exit code 2 (bad input, not a fault to recover from);
    `CheckpointManager.load` logs its one line on rank 0 first and leaves it in the node's
    refusal marker (`leave_marker`), so the run ends failed instead of retrying."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line

    def leave_marker(self) -> None:
        """Write the line to `$MNCLOUD_REFUSED_MARKER` (if set): the launcher's sign that the
        node refused, so that nothing retries it (`REFUSED_EXIT_CODE`)."""
        marker = os.environ.get(REFUSED_MARKER_ENV)
        if marker:
            with contextlib.suppress(OSError):
                Path(marker).write_text(self.line + "\n", encoding="utf-8")


class ModelMismatch(Refusal):
    """The checkpoint was written by a different model (`mncloud.storage.shapes`)."""


def rng_state() -> dict[str, Any]:
    """The python, numpy, torch CPU and CUDA RNG states of this process."""
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        out["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            log.warning("CUDA device count changed; CUDA RNG states not restored")


def tensor_state(state: MutableMapping[str, Any]) -> dict[str, Any]:
    """The part of `state` DCP saves and loads: models, optimizers and plain tensors."""
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    tensors: dict[str, Any] = {}
    for key, val in state.items():
        if isinstance(val, torch.nn.Module):
            tensors[key] = get_model_state_dict(val)
        elif isinstance(val, torch.optim.Optimizer):
            tensors[key] = get_optimizer_state_dict(_owner(val, modules, key), val)
        elif isinstance(val, torch.Tensor):
            tensors[key] = val
    return tensors


def model_shapes(state: MutableMapping[str, Any], tensors: dict[str, Any]) -> dict[str, list[int]]:
    """`{"<state key>.<name>": global shape}` of every model tensor in `tensors` (what
    `tensor_state(state)` returned): what a checkpoint's manifest records of its model
    (`mncloud.storage.shapes`). A sharded tensor counts by its whole shape."""
    return {
        f"{key}.{name}": list(t.shape)
        for key, val in state.items()
        if isinstance(val, torch.nn.Module)
        for name, t in tensors[key].items()
        if isinstance(t, torch.Tensor)
    }


def mesh_of(tensors: Any) -> dict[str, Any]:
    """The device mesh of the first DTensor in `tensors` (nested dicts and lists), as the
    manifest records it: {shape, dims, placements}; {} when nothing is sharded (DDP, one
    process)."""
    from torch.distributed.tensor import DTensor

    stack = [tensors]
    while stack:
        item = stack.pop()
        if isinstance(item, DTensor):
            mesh = item.device_mesh
            return {
                "shape": list(mesh.mesh.shape),
                "dims": list(mesh.mesh_dim_names or ()),
                "placements": [str(p) for p in item.placements],
            }
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return {}


def split_state(state: MutableMapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors for DCP (models, optimizers, tensors) and per-rank extras (the rest, and the RNG
    states), the extras deep-copied: a worker thread serialises them later."""
    tensors = tensor_state(state)
    extras: dict[str, Any] = {}
    for key, val in state.items():
        if key in tensors:
            continue
        if callable(getattr(val, "state_dict", None)) and callable(
            getattr(val, "load_state_dict", None)
        ):
            extras[key] = (_STATEFUL, val.state_dict())
        else:
            extras[key] = (_VALUE, val)
    extras[_RNG_KEY] = (_VALUE, rng_state())
    return tensors, copy.deepcopy(extras)


def restore_state(
    state: MutableMapping[str, Any],
    reader: Any,
    extras: dict[str, Any],
    step: int,
    *,
    pg: Any,
    distributed: bool,
    own_rng: bool = True,
    saved_shapes: dict[str, list[int]] | None = None,
) -> None:
    """Load step `step` into `state` in place: DCP's tensors through `reader` (a DCP
    `StorageReader`; collectives on `pg`), then this rank's `extras` (its `rank_N.pt`, loaded),
    the RNG states last. `own_rng=False` (a rank the saving world did not have, whose extras
    are another rank's): the RNG states stay this process's own, so no two ranks draw the same
    numbers. `saved_shapes` (the manifest's, when it has them): ModelMismatch, before anything
    is read, when they are not this model's."""
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    targets = tensor_state(state)
    if saved_shapes is not None:
        built = model_shapes(state, targets)
        line = shape_mismatch(saved_shapes, built, step=step, where="this script")
        if line is not None:
            raise ModelMismatch(line)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NO_DIST_WARNING)
            dcp.load(
                targets,
                storage_reader=reader,
                process_group=pg,
                no_dist=not distributed,
            )
    except (Exception, CheckpointException) as err:  # DCP's is a BaseException
        raise CheckpointError(f"step {step} does not fit this model/optimizer: {err}") from err
    for key, val in state.items():
        if isinstance(val, torch.nn.Module):
            set_model_state_dict(val, targets[key])
        elif isinstance(val, torch.optim.Optimizer):
            set_optimizer_state_dict(_owner(val, modules, key), val, targets[key])
    for key, (kind, value) in extras.items():
        if key == _RNG_KEY:
            continue
        current = state.get(key)
        if kind == _STATEFUL and current is not None and hasattr(current, "load_state_dict"):
            current.load_state_dict(value)
        elif isinstance(current, dict) and isinstance(value, dict):
            current.clear()
            current.update(value)
        else:
            state[key] = value
    if own_rng:
        set_rng_state(extras[_RNG_KEY][1])  # last: nothing after this may draw random numbers


def _owner(opt: torch.optim.Optimizer, modules: list[torch.nn.Module], key: str) -> Any:
    """The module in the state whose parameters the optimizer updates."""
    first = next((p for g in opt.param_groups for p in g["params"]), None)
    for m in modules:
        if first is None or any(p is first for p in m.parameters()):
            return m
    raise CheckpointError(
        f"optimizer {key!r} updates parameters of no model in the state; put the model in too"
    )
