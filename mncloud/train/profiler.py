"""`mncloud profile`: time and count a few steps of the training script, then stop it.

`mncloud profile SCRIPT` runs the script in one process (`python -m mncloud.train.profiler`)
with `MNCLOUD_PROFILE_OUT` set. The training loop already passes through `mncloud.train` at
every step, and those hooks drive this module:

- `Replicas.steps` yielding a step calls `step_started(step, state, batch)`;
- `Replicas.step(optimizer)` and `CheckpointManager.maybe_save` call `step_done(state)`.

The session times `WARMUP` + `TIMED` steps (from one step's start to the next's), then counts
one more step: FLOPs (`FlopCounterMode`, forward and backward), operators dispatched, tensors
saved for backward (the activations), and, once it is done, the bytes of weights, gradients
and optimizer state found in the training state. It writes one JSON object to
`MNCLOUD_PROFILE_OUT` and ends the script (`SystemExit(0)`).

With `--meta` every `nn.Parameter` the script makes becomes a fake tensor (`FakeTensorMode`):
shapes without storage, so a model larger than this machine's memory is counted exactly from
its shapes while the data, the sampler and the rest of the script stay real. Nothing is timed
then; the first step is the one counted, and the script ends once its optimizer stepped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import runpy
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from mncloud.constants import PROFILE_META_ENV, PROFILE_OUT_ENV

WARMUP = 2
TIMED = 5


class _OpCounter(TorchDispatchMode):
    """Counts operators that launch work (views only relabel memory: not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _cpu_attention_flops(
    query: Any, key: Any, value: Any, *_args: Any, out_shape: Any = None, **_kwargs: Any
) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward_flops(
    grad_out: Any, query: Any, key: Any, value: Any, *_args: Any, out_shape: Any = None, **_kw: Any
) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, query, key, value)


#: Attention on CPU runs kernels FlopCounterMode has no formula for (torch 2.13): the same
#: count as its CUDA flash kernels, so a profile taken on CPU counts attention too.
CPU_FORMULAS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        _cpu_attention_backward_flops
    ),
}


class StepCounter:
    """Counts one step: enter at its start, `close()` once the optimizer stepped."""

    def __init__(self, state: Mapping[str, Any] | None) -> None:
        self._flops = FlopCounterMode(display=False, custom_mapping=CPU_FORMULAS)
        self._ops = _OpCounter()
        self._params = {p.untyped_storage()._cdata for p in _parameters(state)}
        self._saved: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._cuda = torch.cuda.is_available()
        if self._cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._cuda_base = torch.cuda.memory_allocated()
        for mode in (self._flops, self._ops, self._hooks):
            mode.__enter__()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in self._params:
            self._saved[storage._cdata] = storage.nbytes()
        return tensor

    def close(self) -> dict[str, Any]:
        for mode in (self._hooks, self._ops, self._flops):
            mode.__exit__(None, None, None)
        counts: dict[str, Any] = {
            "flops_per_step": self._flops.get_total_flops(),
            "ops_per_step": self._ops.count,
            "activation_bytes": sum(self._saved.values()),
            "activations_measured": False,
        }
        if self._cuda:
            torch.cuda.synchronize()
            counts["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
            counts["activations_measured"] = True
            counts["activation_bytes"] = max(
                counts["activation_bytes"], counts["peak_memory_bytes"] - self._cuda_base
            )
        return counts


def _parameters(state: Mapping[str, Any] | None) -> list[torch.nn.Parameter]:
    seen: dict[int, torch.nn.Parameter] = {}
    for value in (state or {}).values():
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                seen.setdefault(id(p), p)
    return list(seen.values())


def state_bytes(state: Mapping[str, Any] | None) -> dict[str, int]:
    """Parameters, and bytes of weights, gradients and optimizer state, in a training state."""
    params = _parameters(state)
    buffers = [
        b for v in (state or {}).values() if isinstance(v, torch.nn.Module) for b in v.buffers()
    ]
    optimizer: dict[int, int] = {}
    for value in (state or {}).values():
        if isinstance(value, torch.optim.Optimizer):
            for per_param in value.state.values():
                for t in per_param.values():
                    if torch.is_tensor(t):
                        optimizer[t.untyped_storage()._cdata] = t.nbytes
    trainable = [p for p in params if p.requires_grad]
    return {
        "params": sum(p.numel() for p in params),
        "weight_bytes": sum(p.nbytes for p in params) + sum(b.nbytes for b in buffers),
        "grad_bytes": sum(p.numel() * p.element_size() for p in trainable),
        "optimizer_bytes": sum(optimizer.values()),
    }


def shapes_of(state: Mapping[str, Any] | None) -> dict[str, list[int]]:
    """The models' tensors by name and shape, as a checkpoint's manifest records them (`up
    --resume` compares the two before it launches: `mncloud.storage.shapes`)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from mncloud.train.state import model_shapes

    def named(module: torch.nn.Module) -> dict[str, Any]:
        try:
            return get_model_state_dict(module)
        except AttributeError:  # a state-dict hook renames keys (torchtitan's fused QKV)
            return module.state_dict()

    state = dict(state or {})
    modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    return model_shapes(state, {k: named(v) for k, v in modules.items()})


def batch_sizes(batch: Any) -> dict[str, int]:
    """Samples in a batch (its first tensor's first dimension); tokens when that tensor holds
    token ids (two dimensions of integers)."""
    first = _first_tensor(batch)
    if first is None or first.dim() == 0:
        return {}
    sizes = {"samples_per_step": int(first.shape[0])}
    if first.dim() == 2 and not first.is_floating_point() and not first.is_complex():
        sizes["tokens_per_step"] = int(first.numel())
    return sizes


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if torch.is_tensor(batch):
        return batch
    items: Iterable[Any] = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, (list, tuple, Mapping)):
        for item in items:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def matmul_flops(seconds: float = 0.3) -> float:
    """This device's measured matmul FLOP/s (bf16 on a GPU, fp32 on CPU): what MFU is against
    where there is no datasheet (a CPU)."""
    cuda = torch.cuda.is_available()
    n = 4096 if cuda else 512
    kw = {"device": "cuda", "dtype": torch.bfloat16} if cuda else {}
    a, b = torch.randn(n, n, **kw), torch.randn(n, n, **kw)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        if cuda:
            torch.cuda.synchronize()
        done += 1
    return 2 * n**3 * done / (time.perf_counter() - start)


class Session:
    """One profile: times steps, counts one, writes the result and stops the script."""

    def __init__(self, out: str, *, meta: bool) -> None:
        self.out, self.meta = out, meta
        self.skip = 0 if meta else WARMUP + TIMED
        self.starts: list[float] = []
        self.last_step: int | None = None
        self.counter: StepCounter | None = None
        self.sizes: dict[str, int] = {}
        self.parallel: str | None = None
        """How the script spreads its model (`parallelize`'s choice); None: it did not say."""

    def step_started(self, step: int, state: Mapping[str, Any] | None, batch: Any) -> None:
        if step == self.last_step:
            return
        self.last_step = step
        if self.counter is not None:  # no step_done came: the step ended here
            self.finish(state)
        self.starts.append(time.perf_counter())
        if batch is not None and not self.sizes:
            self.sizes = batch_sizes(batch)
        if len(self.starts) > self.skip:
            self.counter = StepCounter(state)

    def step_done(self, state: Mapping[str, Any] | None) -> None:
        if self.counter is not None:
            self.finish(state)

    def finish(self, state: Mapping[str, Any] | None) -> None:
        assert self.counter is not None
        counts, self.counter = self.counter.close(), None
        intervals = [b - a for a, b in itertools.pairwise(self.starts[WARMUP:])]
        cuda = torch.cuda.is_available() and not self.meta
        result = {
            **counts,
            **state_bytes(state),
            "shapes": shapes_of(state),
            "parallel": self.parallel,
            **self.sizes,
            "step_seconds": statistics.median(intervals) if intervals else None,
            "steps_timed": len(intervals),
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "device_matmul_flops": None if self.meta else matmul_flops(),
            "meta": self.meta,
            "torch": torch.__version__,
        }
        with open(self.out, "w") as f:
            json.dump(result, f)
        raise SystemExit(0)


_session: Session | None = None


def session() -> Session | None:
    """The running profile, when this process is `mncloud profile`'s; else None (no cost)."""
    global _session
    if _session is None and os.environ.get(PROFILE_OUT_ENV):
        _session = Session(os.environ[PROFILE_OUT_ENV], meta=bool(os.environ.get(PROFILE_META_ENV)))
    return _session


@contextlib.contextmanager
def fake_parameters() -> Iterator[None]:
    """Every `nn.Parameter` made inside becomes a fake tensor: its shape, no memory.

    Each parameter's real tensor lives only until it is converted (`torch.empty`, untouched),
    so a 7B model is built on a laptop one tensor at a time; operations that mix the fake
    parameters with real data run under the parameters' FakeTensorMode.

    `model.to(device)` (and `fully_shard`'s moves) swap a fake parameter for its converted copy
    (`torch.utils.swap_tensors`), which refuses a tensor with a weak reference: the mode's
    real→fake memo holds one to each fake it made. The memo is emptied before each swap (it only
    spares converting the same real tensor twice).
    """
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    original, original_swap = torch.nn.Parameter.__new__, torch.utils.swap_tensors

    def fake_new(cls: type, data: torch.Tensor | None = None, requires_grad: bool = True) -> Any:
        if data is not None and not isinstance(data, FakeTensor):
            data = mode.from_tensor(data)
        return original(cls, data, requires_grad)

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if isinstance(t1, FakeTensor) or isinstance(t2, FakeTensor):
            mode.fake_tensor_converter.meta_converter.tensor_memo.clear()
        original_swap(t1, t2)

    torch.nn.Parameter.__new__ = fake_new  # type: ignore[method-assign]
    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.nn.Parameter.__new__ = original  # type: ignore[method-assign]
        torch.utils.swap_tensors = original_swap


def main(argv: list[str]) -> None:
    """`python -m mncloud.train.profiler SCRIPT [ARGS]`: run the script as `__main__`."""
    script, args = argv[0], argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    meta = fake_parameters() if os.environ.get(PROFILE_META_ENV) else contextlib.nullcontext()
    with meta:
        runpy.run_path(script, run_name="__main__")
    if os.path.isfile(os.environ.get(PROFILE_OUT_ENV, "")):  # the profile was written, and
        raise SystemExit(0)  # its SystemExit swallowed (torch's `@record` does)
    raise SystemExit(
        "the script ended before mncloud.train saw its steps: the profile needs a loop over "
        "Replicas.steps or CheckpointManager.maybe_save, and at least "
        f"{WARMUP + TIMED + 1} steps"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
