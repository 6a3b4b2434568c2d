"""`mncloud export`: a complete checkpoint → the model as safetensors or one torch file.

    export_checkpoint("s3://team-ckpt/demo", "latest", "out/", fmt="safetensors")

What it does, in order (each step is its own module):

    source.py   pick the step: `latest` is the newest step that verifies (as
                `CheckpointManager.load` picks it); a named step must verify, else it is
                refused with the reason (torn, rewritten, a file missing or short). Only
                DCP's `.metadata` and the shard files that hold the entry are downloaded,
                each checked against the checkpoint's manifest (size and content hash).
    convert.py  DCP's own loader (`_load_state_dict_from_keys`) reads the entry (`model` by
                default) one output shard at a time from every rank's files, the dtype is
                converted if asked, and `safetensors` (or `torch.save`) writes it: at most
                one shard is in memory (the torch format: the entry once, converted in place).
    target.py   the files are written under a temporary name, then renamed into place (a
                directory) or uploaded with `export.json` last (a bucket): a failed export
                leaves nothing at the output.
    run.py      the steps above, end to end; `model.py`: formats, errors, `export.json`

Beside the weights, `export.json` (`ExportManifest`) names the source run and step, the sha256
of the checkpoint's manifest.json, the dtype, and each output file's size and sha256.
This module imports neither torch nor safetensors; `export_checkpoint` does, when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mncloud.export.model import (
    DEFAULT_ENTRY,
    DEFAULT_SHARD_BYTES,
    DTYPES,
    EXPORT_MANIFEST,
    INDEX_FILE,
    ExportedFile,
    ExportError,
    ExportFormat,
    ExportManifest,
    parse_dtype,
    parse_size,
)

if TYPE_CHECKING:
    from mncloud.storage.checkpoints import CheckpointStore


def export_checkpoint(
    store: CheckpointStore | str,
    step: str | int | None,
    out: str,
    *,
    fmt: ExportFormat | str = ExportFormat.SAFETENSORS,
    dtype: str | None = None,
    entry: str = DEFAULT_ENTRY,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    run: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[str, ExportManifest]:
    """Export `step` (a number, `latest` or None) of the checkpoints at `store` into `out` (a
    directory, or an s3:// gs:// file:// URL). Returns where it went and its manifest.

    `progress(phase, done, total)` reports bytes: phase `download` (the step's shard files),
    then `write` (tensor bytes written). Raises ExportError
    (or another MncloudError) with a one-line reason; nothing is left at `out` then.
    """
    try:
        from mncloud.export.run import run_export
    except ImportError as err:  # the core install has no torch
        why = f"mncloud export needs torch: pip install 'mncloud[train]' ({err})"
        raise ExportError(why) from None

    return run_export(
        store, step, out, fmt=ExportFormat.parse(fmt), dtype=parse_dtype(dtype), entry=entry,
        overwrite=overwrite, max_shard_bytes=max_shard_bytes, run=run, progress=progress,
    )  # fmt: skip


__all__ = [
    "DTYPES",
    "EXPORT_MANIFEST",
    "INDEX_FILE",
    "ExportError",
    "ExportFormat",
    "ExportManifest",
    "ExportedFile",
    "export_checkpoint",
    "parse_dtype",
    "parse_size",
]
