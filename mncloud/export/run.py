"""One export, end to end: choose and pull the step, convert, write, commit (see the package
docstring). Imports torch and safetensors."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from mncloud.errors import MncloudError
from mncloud.export import convert, source
from mncloud.export.model import ExportedFile, ExportError, ExportFormat, ExportManifest
from mncloud.export.target import Target
from mncloud.storage.checkpoints import CheckpointStore, sha256_file


def run_export(
    store: CheckpointStore | str,
    step: str | int | None,
    out: str,
    *,
    fmt: ExportFormat,
    dtype: str | None,
    entry: str,
    overwrite: bool,
    max_shard_bytes: int,
    run: str | None,
    progress: Callable[[str, int, int], None] | None,
) -> tuple[str, ExportManifest]:
    """`mncloud.export.export_checkpoint`, its arguments parsed."""
    store = CheckpointStore(store) if isinstance(store, str) else store
    chosen = source.choose(store, step)  # refused before anything is written
    target = Target.open(out, overwrite=overwrite)
    work = Path(tempfile.mkdtemp(prefix="mncloud-export-src-"))
    try:
        written, items, total = _convert(
            chosen, work, target.staging, fmt, dtype, entry, max_shard_bytes, progress
        )
        manifest = ExportManifest(
            source=store.uri, run=run, step=chosen.step,
            checkpoint_manifest_sha256=chosen.manifest_sha256, entry=entry, format=fmt,
            dtype=dtype, dtypes=sorted({d for _, names in written for d in names}),
            tensors=sum(i.dtype is not None for i in items), tensor_bytes=total,
            files={name: _file(target.staging / name) for name, _ in written},
            torch_version=torch.__version__,
        )  # fmt: skip
        target.commit([name for name, _ in written], manifest.to_bytes())
    except BaseException as err:
        target.abort()
        if isinstance(err, MncloudError) or not isinstance(err, Exception | CheckpointException):
            raise
        why = f"{type(err).__name__}: {err}"
        raise ExportError(f"export of step {chosen.step} failed: {why}") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target.shown, manifest


def _convert(
    chosen: source.Source,
    work: Path,
    staging: Path,
    fmt: ExportFormat,
    dtype: str | None,
    entry: str,
    max_shard_bytes: int,
    progress: Callable[[str, int, int], None] | None,
) -> tuple[list[tuple[str, list[str]]], list[convert.Item], int]:
    """Pull the files that hold `entry` into `work` and write the export into `staging`:
    the files written (with their dtypes), the entry's items, and its tensor bytes."""
    source.pull_metadata(chosen, work)
    metadata = convert.read_metadata(work)
    items = convert.entry_items(metadata, entry, chosen.step)
    names = convert.shard_files(metadata, items)
    size = sum(chosen.manifest.files[n].size for n in names if n in chosen.manifest.files)
    source.pull_shards(chosen, work, names, _counter("download", size, progress))
    torch_dtype = getattr(torch, dtype) if dtype else None
    total = sum(i.nbytes(torch_dtype) for i in items)
    advance = _counter("write", total, progress)
    written = convert.write(
        work, items, staging, entry=entry, fmt=fmt, dtype=torch_dtype,
        max_bytes=max_shard_bytes, progress=advance,
    )  # fmt: skip
    return list(written), items, total


def _file(path: Path) -> ExportedFile:
    return ExportedFile(size=path.stat().st_size, sha256=sha256_file(path))


def _counter(
    phase: str, total: int, progress: Callable[[str, int, int], None] | None
) -> Callable[[int], None]:
    """A callback that adds up bytes and reports `(phase, done, total)` to `progress`."""
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(phase, done, total)

    return advance
