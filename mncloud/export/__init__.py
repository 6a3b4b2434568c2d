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

Beside the weights, `export.json` (`ExportManifest`) names the source run and step, the sha256
of the checkpoint's manifest.json, the dtype, and each output file's size and sha256.
This module imports neither torch nor safetensors; `export_checkpoint` does, when called.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from mncloud import __version__
from mncloud.errors import MncloudError

if TYPE_CHECKING:
    from mncloud.storage.checkpoints import CheckpointStore

EXPORT_MANIFEST = "export.json"
"""The export's own manifest, written last."""
INDEX_FILE = "model.safetensors.index.json"
"""Hugging Face's index of a sharded safetensors export (for the `model` entry)."""
DEFAULT_ENTRY = "model"
DEFAULT_SHARD_BYTES = 5 * 10**9
"""Safetensors files are cut at this size (Hugging Face's default `max_shard_size`, 5 GB)."""
DTYPES = ("bfloat16", "float16", "float32")


class ExportError(MncloudError):
    """An export was refused (bad input, a step that does not verify) or failed."""


class ExportFormat(str, Enum):
    """What `mncloud export` writes."""

    SAFETENSORS = "safetensors"
    """`model.safetensors`, or shards with a Hugging Face index above the size limit."""
    TORCH = "torch"
    """One `torch.save` file, `model.pt`."""

    @classmethod
    def parse(cls, value: object, flag: str = "--format") -> ExportFormat:
        """The format a user named; ExportError listing the known ones otherwise."""
        try:
            return cls(str(getattr(value, "value", value)).strip().lower())
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ExportError(f"{flag} {value!r} is unknown; choose one of: {names}") from None


def parse_dtype(value: str | None) -> str | None:
    """A `--dtype` name (None keeps the saved dtypes); ExportError for an unknown one."""
    if value is None:
        return None
    name = value.strip().lower()
    if name not in DTYPES:
        raise ExportError(f"--dtype {value!r} is unknown; choose one of: {', '.join(DTYPES)}")
    return name


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*", re.ASCII | re.IGNORECASE)


def parse_size(text: str, flag: str = "--max-shard-size") -> int:
    """`5GB`, `500MB`, `2GiB` or a number of bytes → bytes (at least 1 KB); ExportError else."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ExportError(f"{flag} {text[:40]!r}: write a size like 5GB, 500MB or 2GiB")
    unit = match.group(2).lower().removesuffix("b")  # "", "k", "ki", "g", "gi", …
    power = "kmgt".find(unit[:1]) + 1 if unit else 0
    value = float(match.group(1)) * (1024 if unit.endswith("i") else 1000) ** power
    if not 1000 <= value <= 10**15:
        raise ExportError(f"{flag} {text[:40]!r}: give a size from 1KB to 1PB")
    return int(value)


class ExportedFile(BaseModel):
    """One output file: its size and sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=0)
    sha256: str


class ExportManifest(BaseModel):
    """`export.json`: where the weights came from and what was written."""

    model_config = ConfigDict(extra="forbid")

    source: str
    """The checkpoint URI (`<bucket>/<name>`)."""
    run: str | None = None
    """The run's name, when the export was asked for by name (or by the run itself)."""
    step: int = Field(ge=0)
    checkpoint_manifest_sha256: str
    """sha256 of the step's manifest.json (the value its COMPLETE marker holds)."""
    entry: str
    """The part of the training state exported (`model`)."""
    format: ExportFormat
    dtype: str | None
    """The dtype floating-point tensors were converted to; None: as saved."""
    dtypes: list[str]
    """The dtypes of the tensors written."""
    tensors: int = Field(ge=0)
    tensor_bytes: int = Field(ge=0)
    files: dict[str, ExportedFile]
    """Output file name → size and sha256 (export.json itself excluded)."""
    created_at: float = Field(default_factory=time.time)
    mncloud_version: str = __version__
    torch_version: str = ""

    def to_bytes(self) -> bytes:
        """The JSON written as export.json."""
        return (self.model_dump_json(indent=1) + "\n").encode()


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
