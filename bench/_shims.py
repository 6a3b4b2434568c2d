"""Work-arounds `bench/gpu.py` applies for torch releases that break mncloud, each announced.

Each function returns a line saying what it changed, or None when this torch needs nothing.
They exist so the GPU figures can be taken on the torch a machine has; the line they print
names the mncloud bug they hide (see the benchmark's report).
"""

from __future__ import annotations

import os
from typing import Any

#: Set by `bench/gpu.py` for the training jobs it launches when the staging shim is on.
SHIM_ENV = "MNCLOUD_BENCH_STAGING_SHIM"


def staging_shim() -> str | None:
    """torch 2.11's `DefaultStager._stage` closes its `StateDictStager` after every stage, which
    clears the stager's deepcopy dispatch table (and its cached CPU buffers): the next `stage` on
    the same `DefaultStager` raises KeyError(<class 'type'>). mncloud's `StagingSlots` keep one
    `DefaultStager` per slot and stage into it at every save, so every save after the first
    (after the warm-up at `load`: every save) fails. Patch `_stage` to stage without closing,
    which is what torch 2.13 does."""
    import torch
    from torch.distributed.checkpoint import staging

    opts = staging.StagingOptions(
        use_pinned_memory=False,
        use_shared_memory=False,
        use_async_staging=False,
        use_non_blocking_copy=False,
    )
    probe = staging.DefaultStager(opts)
    try:
        for _ in range(2):
            probe.stage({"t": torch.zeros(1)})
        return None
    except KeyError:
        pass
    original = staging.DefaultStager._stage

    def _stage(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        if self._config.use_non_blocking_copy:
            return original(self, state_dict, **kwargs)
        return self._state_dict_stager.stage(state_dict, non_blocking=False)

    staging.DefaultStager._stage = _stage  # type: ignore[method-assign]
    os.environ[SHIM_ENV] = "1"
    return (
        f"torch {torch.__version__}: DefaultStager._stage closes its StateDictStager after each "
        "stage, so mncloud's reused staging slots fail from the 2nd stage on (KeyError "
        "<class 'type'>); patched to stage without closing (as torch 2.13 does)"
    )


def wrap_ddp_checked(model: Any) -> tuple[Any, str]:
    """`mncloud.train.wrap_ddp(model)`; where this torch rejects its exact mode (torch 2.11:
    AssertionError 'bucket_cap_mb should be set by now' for `bucket_cap_mb_list=[0]`), plain
    DDP buckets instead - harmless for one process, whose all-reduce sums nothing."""
    import torch.distributed as dist

    from mncloud.train import wrap_ddp

    try:
        return wrap_ddp(model), "wrap_ddp exact"
    except AssertionError as err:
        if dist.get_world_size() > 1:
            raise
        return wrap_ddp(model, exact=False), f"wrap_ddp exact=False (exact mode failed: {err})"
