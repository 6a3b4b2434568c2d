"""The step to export: chosen and verified like `CheckpointManager.load` does, then only the
files that hold the exported entry downloaded and checked against the checkpoint's manifest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mncloud.errors import CheckpointError
from mncloud.export.model import ExportError
from mncloud.storage.checkpoints import DCP_METADATA, MANIFEST, CheckpointStore, Manifest

"""DCP's index of every rank's shards (which file, which bytes)."""


@dataclass(frozen=True)
class Source:
    """A verified step: its number, manifest, and the sha256 of its manifest.json."""

    store: CheckpointStore
    step: int
    manifest: Manifest
    manifest_sha256: str


def parse_step(step: str | int | None) -> int | None:
    """A STEP argument: a whole number, or None for `latest`; ExportError otherwise."""
    if step is None or isinstance(step, int):
        return step
    if step.strip().lower() == "latest":
        return None
    try:
        number = int(step)
    except ValueError:
        raise ExportError(f"STEP must be a number or 'latest', not {step!r}") from None
    if number < 0:
        raise ExportError(f"STEP must be a number ≥ 0 or 'latest', not {step!r}")
    return number


def choose(store: CheckpointStore, step: str | int | None) -> Source:
    """The step to export: `step`, refused with the reason unless it verifies, or the newest
    step that verifies (`latest`, the one `CheckpointManager.load` would restore)."""
    number = parse_step(step)
    if number is None:
        good, skipped = store.candidates()
        if not good:
            why = "".join(f"; step {v.step}: {v.reason}" for v in skipped[:3])
            raise ExportError(f"no complete checkpoint at {store.uri}{why}")
        number = good[0]
    else:
        verdict = store.verify(number)
        if not verdict.ok:
            raise ExportError(f"step {number} at {store.uri} cannot be exported: {verdict.reason}")
    try:
        raw = store.bucket.get_bytes(store.key(number, MANIFEST))
    except Exception as err:  # gone since it verified (a retention pass)
        raise ExportError(f"step {number} at {store.uri}: {MANIFEST} unreadable: {err}") from err
    return Source(store, number, Manifest.from_bytes(raw), hashlib.sha256(raw).hexdigest())


def pull_metadata(source: Source, local: Path) -> None:
    """Download and check DCP's `.metadata` of the step into `local`."""
    if DCP_METADATA not in source.manifest.files:
        raise ExportError(f"step {source.step} holds no DCP checkpoint ({DCP_METADATA} missing)")
    _pull(source, local, [DCP_METADATA])


def pull_shards(
    source: Source, local: Path, names: list[str], progress: Callable[[int], None] | None
) -> None:
    """Download and check the shard files `names` (sizes and content hashes)."""
    missing = sorted(n for n in names if n not in source.manifest.files)
    if missing:
        raise ExportError(
            f"step {source.step}: the manifest lists no {', '.join(missing)}, which DCP's "
            "metadata names; the checkpoint is inconsistent"
        )
    _pull(source, local, names, progress)


def _pull(
    source: Source, local: Path, names: list[str], progress: Callable[[int], None] | None = None
) -> None:
    try:
        source.store.pull(source.step, local, names=names, content=True, progress=progress)
    except CheckpointError as err:
        raise ExportError(f"step {source.step} cannot be exported: {err}") from None
