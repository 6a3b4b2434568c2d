"""torchtitan's own trainer (`python -m torchtitan.train`), unchanged, on a CPU-only local node.

torchtitan 0.3.0 is written for accelerators. On the local backend's CPU nodes (gloo) the site
hook (`sitehook.py`) applies these, each once its torchtitan module has imported, and only when
torch sees no CUDA device (on GPUs nothing here runs):

    tools.utils                device_type "cpu" (it falls back to "cuda"), a device module
                               with the memory calls its monitor makes; gloo follows from "cpu"
    models.common.attention    FlexAttention through a dense masked softmax: torch refuses
                               FlexAttention's backward on CPU (the same mask, the same maths)
    distributed.fsdp           FSDP2 reduces with plain SUM (torchtitan's divide factor is 1):
                               gloo has no PREMUL_SUM
    distributed.utils          `torch.distributed.set_timeout` where this torch lacks it
    three GPU-kernel modules   `import triton` finds a stand-in while they import (a dense CPU
                               run never calls them; CPU torch ships no triton)

And everywhere (CPU or GPU, when `mncloud.train.titan` is reached through the site hook): its
`Trainer.train_step` reports each step to the run's telemetry (`report`), and the start (with
the step it resumed from) and the end are events of rank 0, so the goodput ledger counts
torchtitan's own steps; at the first save, a `checkpoint.folder` outside `--ckpt-dir` is
warned of in one line. Under `mncloud profile` each step goes to the profiler too (the first
model part, its optimizer, a batch of `local_batch_size` × `seq_len` tokens), in a world of
one rank (torchrun's variables, set when the trainer's module imports).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

#: Modules whose import needs a stand-in `triton` on a CPU-only machine.
NEEDS_TRITON = (
    "torchtitan.distributed.minimal_async_ep.kernels",
    "torchtitan.overrides.fused_mla",
    "torchtitan.overrides.fused_swiglu",
)
#: Modules patched once imported.
PATCHED = (
    "torchtitan.tools.utils",
    "torchtitan.models.common.attention",
    "torchtitan.distributed.fsdp",
    "torchtitan.distributed.utils",
    "torchtitan.trainer",
    "torchtitan.components.checkpointer.dcp",
)


def cpu_only() -> bool:
    import torch

    return not torch.cuda.is_available()


# --------------------------------------------------------------------------- import time


class _Absorb:
    """Stands in for anything of triton: attributes, calls, subscripts, `@triton.jit`."""

    def __getattr__(self, name: str) -> _Absorb:
        return _Absorb()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a bare decorator
        return _Absorb()

    def __getitem__(self, key: Any) -> _Absorb:
        return _Absorb()


@contextlib.contextmanager
def importing(name: str) -> Iterator[None]:
    """Around the import of `name`: a stand-in `triton` while a GPU-kernel module imports
    on a CPU-only machine (never left in `sys.modules`, never when triton is installed)."""
    if name not in NEEDS_TRITON or not cpu_only():
        yield
        return
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        yield
        return
    stand_ins = {n: types.ModuleType(n) for n in ("triton", "triton.language")}
    for module in stand_ins.values():
        module.__getattr__ = lambda _attr: _Absorb()  # type: ignore[method-assign]
    stand_ins["triton"].language = stand_ins["triton.language"]  # type: ignore[attr-defined]
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for n in stand_ins:
            sys.modules.pop(n, None)


def imported(name: str, module: Any) -> None:
    """Patch `module` (one of `PATCHED`) once it has imported."""
    if name == "torchtitan.components.checkpointer.dcp":
        _check_first_save(module.CheckpointManager)
    elif name == "torchtitan.trainer":
        _report_steps(module.Trainer)
        if _profile() is not None:  # before its trainer starts a process group
            for key, value in _one_rank_world().items():
                os.environ.setdefault(key, value)
    elif cpu_only():
        {
            "torchtitan.tools.utils": _cpu_device,
            "torchtitan.models.common.attention": _dense_attention,
            "torchtitan.distributed.fsdp": _sum_reductions,
            "torchtitan.distributed.utils": _set_timeout,
        }[name](module)


# --------------------------------------------------------------------------- the patches


def _cpu_device(utils: Any) -> None:
    import torch

    device = types.ModuleType("mncloud_cpu_device")
    for attr in dir(torch.cpu):
        if not attr.startswith("__"):
            setattr(device, attr, getattr(torch.cpu, attr))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    device.current_device = lambda: 0  # type: ignore[attr-defined] # barrier(device_ids=[…])
    device.get_device_name = lambda *_a, **_k: "cpu"  # type: ignore[attr-defined]
    device.get_device_properties = lambda *_a, **_k: types.SimpleNamespace(  # type: ignore[attr-defined]
        total_memory=ram, name="cpu"
    )
    for name in ("reset_peak_memory_stats", "empty_cache"):
        setattr(device, name, lambda *_a, **_k: None)
    device.memory_stats = lambda *_a, **_k: {}  # type: ignore[attr-defined]
    device.is_available = lambda: True  # type: ignore[attr-defined]
    device.memory = types.SimpleNamespace(  # type: ignore[attr-defined]
        _record_memory_history=lambda *_a, **_k: None, _snapshot=lambda *_a, **_k: {}
    )
    utils.device_type, utils.device_module = "cpu", device
    utils.get_device_info = lambda: (utils.device_type, utils.device_module)


def dense_flex_attention(
    q: Any, k: Any, v: Any, *, score_mod: Any = None, block_mask: Any = None,
    scale: float | None = None, return_aux: Any = None, **_: Any,
) -> Any:  # fmt: skip
    """`flex_attention` as masked softmax attention over the block mask's `mask_mod`, with a
    backward on CPU; the log-sum-exp when `return_aux` asks for it."""
    import torch
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    if score_mod is not None:
        raise NotImplementedError("mncloud's CPU flex_attention takes no score_mod")
    batch, heads, length, dim = q.shape
    if k.shape[1] != heads:  # grouped-query attention
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if block_mask is not None:
        keys = k.shape[-2]
        mask = create_mask(block_mask.mask_mod, batch, 1, length, keys, device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    out = torch.matmul(weights, v.float()).to(q.dtype)
    return out, AuxOutput(lse=lse if getattr(return_aux, "lse", False) else None)


def _dense_attention(attention: Any) -> None:
    attention.FlexAttention._compiled_flex_attn = staticmethod(dense_flex_attention)


def _sum_reductions(fsdp: Any) -> None:
    original = fsdp.disable_fsdp_gradient_division

    @functools.wraps(original)
    def disable_fsdp_gradient_division(model: Any) -> None:
        original(model)
        for part in model.modules():
            if isinstance(part, fsdp.FSDPModule):
                part.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division


def _set_timeout(_utils: Any) -> None:
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = _set_pg_timeout  # type: ignore[attr-defined]


def _check_first_save(manager_cls: type) -> None:
    """At its first save, one warning line when `--ckpt-dir` is set and torchtitan's
    `checkpoint.folder` lies outside it (`frameworks.SaveCheck`)."""
    if getattr(manager_cls.save, "_mncloud", False):
        return
    from mncloud.train.frameworks import SaveCheck

    check = SaveCheck("torchtitan trainer", "--checkpoint.folder")
    save_once = manager_cls.save  # type: ignore[attr-defined]

    @functools.wraps(save_once)
    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = save_once(self, *args, **kwargs)
        if saved:
            check.first_save(self.folder, os.environ.get("RANK", "0") == "0")
        return saved

    save._mncloud = True  # type: ignore[attr-defined]
    manager_cls.save = save  # type: ignore[attr-defined]


def _report_steps(trainer_cls: type) -> None:
    """Each `train_step` reported; `start` (resumed from) before the first, `done` after."""
    if getattr(trainer_cls.train_step, "_mncloud", False):
        return
    from mncloud.train.steptime import event, report

    step_once, train_once = trainer_cls.train_step, trainer_cls.train  # type: ignore[attr-defined]

    def is_rank_zero() -> bool:
        return os.environ.get("RANK", "0") == "0"

    @functools.wraps(step_once)
    def train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_mncloud_started", False):
            self._mncloud_started = True
            if is_rank_zero():
                event("start", resumed_from=self.step - 1,
                      world_size=int(os.environ.get("WORLD_SIZE", "1")))  # fmt: skip
        profile = _profile()
        if profile is not None:
            profile.step_started(self.step, _profiled(self), _tokens(self))
        out = step_once(self, *args, **kwargs)
        report(self.step)
        if profile is not None:
            profile.step_done(_profiled(self))
        return out

    @functools.wraps(train_once)
    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = train_once(self, *args, **kwargs)
        if is_rank_zero():
            event("done", steps=self.step)
        return out

    train_step._mncloud = True  # type: ignore[attr-defined]
    trainer_cls.train_step, trainer_cls.train = train_step, train  # type: ignore[attr-defined]


def _one_rank_world() -> dict[str, str]:
    """torchrun's variables for a world of this one process (`--standalone
    --nproc_per_node=1`): `mncloud profile` runs the script alone, and torchtitan's trainer
    starts a process group whatever its size."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip


def _profile() -> Any:
    """`mncloud profile`'s session in this process, or None."""
    from mncloud.constants import PROFILE_OUT_ENV

    if not os.environ.get(PROFILE_OUT_ENV):
        return None
    from mncloud.train.profiler import session

    return session()


def _profiled(trainer: Any) -> dict[str, Any]:
    from mncloud.train.frameworks import profile_state

    inner = getattr(trainer.optimizers, "optimizers", [])  # one optimizer per model part
    return profile_state(trainer.model_parts[0], inner[0] if inner else trainer.optimizers)


def _tokens(trainer: Any) -> Any:
    """A batch shaped as one step's tokens on this rank (the profiler counts its size)."""
    import torch

    training = trainer.config.training
    return torch.zeros(training.local_batch_size, training.seq_len, dtype=torch.long)
