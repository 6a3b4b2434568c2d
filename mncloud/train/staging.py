"""Staging slots: the CPU copies of the training state that a checkpoint is written from.

A save copies every tensor into a free slot (the only part that stalls training); the slot
stays busy until that save's files are uploaded. With two slots, the snapshot of an interval
that comes while the previous upload still runs waits in the second slot and is written as
soon as that upload ends, so no interval is skipped; a third interval that finds both busy
blocks until the older one is committed (`SaveStats.blocked`). Memory: at most `slots` copies
of this rank's tensors.

Each slot's buffers are allocated once (DCP's `StateDictStager` keeps one CPU buffer per source
storage) and reused. `warm` allocates them before the first interval, in the background - from
`load` on, and again after the first step (an optimizer's state only exists from then on) - so
neither a resume nor the first save waits for them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mncloud.storage.checkpoints import FileEntry
from mncloud.storage.chunks import SUFFIX, FileHasher, chunked

log = logging.getLogger(__name__)


@dataclass
class SaveStats:
    """What the interval saves of one `CheckpointManager` cost the training thread."""

    saves: int = 0
    """Saves started (staged on every rank)."""
    queued: int = 0
    """Saves staged while an earlier one was still uploading (written right after it)."""
    blocked: int = 0
    """Saves that had to wait because both staging slots were busy."""
    blocked_s: float = 0.0
    """Seconds the training thread waited for a slot, in all."""
    last_blocked_s: float = 0.0
    """Seconds the last blocked save waited."""
    first_stall_s: float | None = None
    """Seconds the first save call took on the training thread."""
    max_stall_s: float = 0.0
    """The longest save call on the training thread (asynchronous saves only)."""

    def record_stall(self, seconds: float) -> None:
        """Count one save call's time on the training thread."""
        if self.first_stall_s is None:
            self.first_stall_s = seconds
        self.max_stall_s = max(self.max_stall_s, seconds)


def count_tensors(obj: Any) -> int:
    """Tensors in a nested dict/list/tuple (how much a warm-up has to cover)."""
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(count_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_tensors(v) for v in obj)
    return 0


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested dict/list/tuple."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _new_stager(*, pin_memory: bool) -> Any:
    """A stager whose CPU buffers are kept from one `stage` to the next.

    DCP's `StateDictStager` holds the buffers: it is used directly, because `DefaultStager`
    (its public wrapper) closes it after every stage on torch 2.11, which empties its cache and
    makes the next stage fail (KeyError <class 'type'>); torch 2.13 no longer does. Where
    the class is missing (a torch that moved it), `DefaultStager` is the fallback.
    """
    try:
        from torch.distributed.checkpoint._state_dict_stager import StateDictStager
    except ImportError:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        return DefaultStager(
            StagingOptions(
                use_pinned_memory=pin_memory,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
        )
    return StateDictStager(pin_memory=pin_memory, share_memory=False)


class StagingSlots:
    """`n` independent sets of reusable CPU buffers, staged into one at a time per slot."""

    def __init__(self, n: int) -> None:
        self._stagers: list[Any] = [None] * n
        self._warming: threading.Thread | None = None
        self.warmed_tensors = 0
        """How many tensors the last warm-up covered."""

    def _stager(self, slot: int) -> Any:
        if self._stagers[slot] is None:
            self._stagers[slot] = _new_stager(pin_memory=torch.cuda.is_available())
        return self._stagers[slot]

    def stage(self, slot: int, tensors: dict[str, Any]) -> dict[str, Any]:
        """Copy `tensors` into the slot's buffers (waits for a warm-up still running)."""
        self.wait_warm()
        return self._stager(slot).stage(tensors)

    def warm(self, tensors: dict[str, Any], slots: int, *, background: bool) -> None:
        """Allocate the first `slots` slots' buffers for `tensors` (values are overwritten by
        the next real save, so a copy of tensors that training changes meanwhile is fine).

        In the background, a warm-up still running is followed, not waited for: the training
        thread never blocks here (a save waits for every warm-up before it stages)."""
        previous = self._warming
        self.warmed_tensors = count_tensors(tensors)

        def run() -> None:
            if previous is not None:
                previous.join()
            for slot in range(slots):
                try:
                    self._stager(slot).stage(tensors)
                except Exception as err:  # a real save stages (and reports) again
                    log.debug("warming staging slot %d failed: %s", slot, err)
                    return

        if not background:
            run()
            self._warming = None
            return
        self._warming = threading.Thread(target=run, name="mncloud-ckpt-warm", daemon=True)
        self._warming.start()

    def wait_warm(self) -> None:
        """Block until a background warm-up (if any) finished."""
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def close(self) -> None:
        """Release every slot's buffers."""
        self.wait_warm()
        for stager in self._stagers:
            if stager is not None:
                stager.close()
        self._stagers = [None] * len(self._stagers)


class _HashingStream(io.RawIOBase):
    """A binary file that hashes (xxh3_128) what is written through it, per chunk too when
    `chunks` (a shard file: `storage.chunks`)."""

    def __init__(self, raw: Any, *, chunks: bool) -> None:
        super().__init__()
        self._raw = raw
        self.hasher = FileHasher(chunks=chunks)
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        n = self._raw.write(view)
        self.hasher.update(view[:n])
        self.size += n
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def entry(self) -> FileEntry:
        """The size and hash of everything written so far."""
        return FileEntry.of(self.size, self.hasher.hexdigest())


def hashing_filesystem() -> Any:
    """A DCP `FileSystem` that hashes each file while writing it: `.digests[name]` is its
    `FileEntry`, so the upload need not read the files a second time to hash them. A shard
    file's chunk hashes are written beside it as its sidecar (`storage.chunks`)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.digests: dict[str, FileEntry] = {}

        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
            if "w" not in mode:
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            name = Path(path).name
            with open(path, mode) as raw:
                stream = _HashingStream(raw, chunks=chunked(name))
                yield stream
            self.digests[name] = stream.entry()
            if chunked(name):
                Path(path).with_name(name + SUFFIX).write_bytes(stream.hasher.sidecar())

        def rename(self, path: Any, new_path: Any) -> None:
            super().rename(path, new_path)
            if Path(path).name in self.digests:
                self.digests[Path(new_path).name] = self.digests.pop(Path(path).name)

    return HashingFileSystem()
