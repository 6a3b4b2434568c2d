"""What an export is made of: its formats and errors, the option parsers, and `export.json`.

Light (pydantic, no torch): the CLI, the spec and each step of the export import it.
"""

from __future__ import annotations

import re
import time
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from mncloud import __version__
from mncloud.errors import MncloudError

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
