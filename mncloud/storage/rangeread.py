"""Verified reads of byte ranges of one committed step's files: what a resume fetches.

    files = StepFiles(store, manifest)
    got = files.read([("__1_0.distcp", 0, 4096), ("__1_0.distcp", 4096, 9000)])
    got[("__1_0.distcp", 4096, 9000)]            # a memoryview of exactly those bytes

The ranges of one file are widened to the chunk grid of its sidecar (`storage.chunks`), merged
where they touch into runs, and each run is fetched as pieces of at most `piece_bytes` with
`workers` ranged GETs in flight (S3, GCS; a folder bucket reads them directly); every chunk is
checked against its digest as its piece lands. A range is never returned unchecked when the
step has sidecars. A short read, a missing object or a failed chunk raises `RangeRefused`,
naming the file and the bytes: the caller refuses the whole step (nothing of it was used yet).

A step without sidecars (saved before them) is read with only the sizes checked, or, with
`whole_files`, each file it touches is read whole and checked against its whole-file hash.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mncloud.errors import CheckpointError
from mncloud.storage.buckets import ObjectNotFoundError, ShortReadError
from mncloud.storage.checkpoints import CheckpointStore, Manifest, hash_bytes
from mncloud.storage.chunks import SUFFIX, ChunkDigests, chunk_size_of

log = logging.getLogger(__name__)

Range = tuple[str, int, int]
"""(file name in the step, first byte, end byte exclusive)."""
Alloc = Callable[[int], memoryview]
"""Gives a writable buffer of n bytes (memory, or a file mapped when memory is short)."""

PIECE_BYTES = 16 * 2**20
"""Bytes per ranged GET at most (runs are cut into pieces this size, on chunk boundaries)."""


class RangeRefused(CheckpointError):
    """A range of the step could not be read whole and verified: the step is not used."""


def memory(n: int) -> memoryview:
    """n writable bytes of anonymous memory, faulted in as they are written (a bytearray
    would first write n zeros: half a second a GB here)."""
    return memoryview(mmap.mmap(-1, n)) if n else memoryview(bytearray())


@dataclass(frozen=True)
class _Run:
    """Contiguous bytes of one file fetched as one buffer."""

    name: str
    start: int
    end: int


class StepFiles:
    """Verified ranged reads of one committed step (`manifest`) in `store`."""

    def __init__(
        self,
        store: CheckpointStore,
        manifest: Manifest,
        *,
        workers: int = 16,
        piece_bytes: int = PIECE_BYTES,
        whole_files: bool = False,
    ) -> None:
        self.store = store
        self.manifest = manifest
        self.workers = workers
        self.piece_bytes = piece_bytes
        self.chunk_size = chunk_size_of(manifest.extra)
        self.whole_files = whole_files and self.chunk_size is None
        self.fetched_bytes = 0
        """Bytes this object read from the bucket (sidecars included)."""
        self._count = threading.Lock()

    # ------------------------------------------------------------------ planning
    def _runs(
        self, ranges: Iterable[Range], digests: dict[str, ChunkDigests]
    ) -> dict[_Run, list[Range]]:
        """The runs to fetch (ranges widened to the chunk grid, merged where they touch), each
        with the requested ranges inside it."""
        by_file: dict[str, list[tuple[int, int, Range]]] = {}
        for rng in ranges:
            name, start, end = rng
            entry = self.manifest.files.get(name)
            if entry is None:
                raise RangeRefused(f"step {self.manifest.step} has no file {name}")
            if not 0 <= start <= end <= entry.size:
                raise RangeRefused(f"{name} bytes {start}-{end - 1} lie outside its "
                                   f"{entry.size} bytes")  # fmt: skip
            if name in digests:
                lo, hi = digests[name].span(start, end)
            elif self.whole_files:
                lo, hi = 0, entry.size
            else:
                lo, hi = start, end
            by_file.setdefault(name, []).append((lo, hi, rng))
        runs: dict[_Run, list[Range]] = {}
        for name, spans in by_file.items():
            spans.sort()
            lo, hi, inside = spans[0][0], spans[0][1], [spans[0][2]]
            for s_lo, s_hi, rng in spans[1:]:
                if s_lo <= hi:
                    hi = max(hi, s_hi)
                    inside.append(rng)
                    continue
                runs[_Run(name, lo, hi)] = inside
                lo, hi, inside = s_lo, s_hi, [rng]
            runs[_Run(name, lo, hi)] = inside
        return runs

    def _pieces(self, run: _Run) -> list[tuple[int, int]]:
        """(offset in the file, length) of each GET of a run, cut on chunk boundaries."""
        step = self.piece_bytes
        if self.chunk_size:
            step = max(self.chunk_size, step - step % self.chunk_size)
        return [(at, min(step, run.end - at)) for at in range(run.start, run.end, step)]

    # ------------------------------------------------------------------ reading
    def sidecars(self, names: Iterable[str]) -> dict[str, ChunkDigests]:
        """The chunk digests of these files (each sidecar read whole, checked against its
        manifest entry); {} for a step without sidecars."""
        if self.chunk_size is None:
            return {}
        wanted = sorted(set(names))
        out: dict[str, ChunkDigests] = {}
        for name in wanted:
            side = name + SUFFIX
            entry = self.manifest.files.get(side)
            if entry is None:
                raise RangeRefused(f"step {self.manifest.step} has no {side}")
            raw = self._get(side, 0, entry.size)
            if len(raw) != entry.size or hash_bytes(raw, entry.algo) != entry.digest:
                raise RangeRefused(f"{side} differs from the manifest")
            digests = ChunkDigests(name, self.manifest.files[name].size, raw, self.chunk_size)
            if (problem := digests.problem()) is not None:
                raise RangeRefused(problem)
            out[name] = digests
        return out

    def read(self, ranges: Iterable[Range], alloc: Alloc = memory) -> dict[Range, memoryview]:
        """Each range's bytes, verified; RangeRefused (file and bytes named) when one cannot
        be read whole or fails its check."""
        ranges = list(dict.fromkeys(ranges))
        if not ranges:
            return {}
        digests = self.sidecars(name for name, _, _ in ranges)
        runs = self._runs(ranges, digests)
        buffers = {run: alloc(run.end - run.start) for run in runs}
        jobs = [(run, at, n) for run in runs for at, n in self._pieces(run)]
        jobs.sort(key=lambda job: -job[2])  # big pieces first

        def fetch(job: tuple[_Run, int, int]) -> str | None:
            run, at, n = job
            into = buffers[run][at - run.start : at - run.start + n]
            self._get_into(run.name, at, into)
            if run.name in digests:
                return digests[run.name].check(at, into)
            return None

        with ThreadPoolExecutor(max(1, self.workers), thread_name_prefix="mncloud-range") as pool:
            problems = [p for p in pool.map(fetch, jobs) if p]
        if problems:
            raise RangeRefused(problems[0])
        if self.whole_files:
            self._check_whole(buffers)
        out: dict[Range, memoryview] = {}
        for run, inside in runs.items():
            for rng in inside:
                out[rng] = buffers[run][rng[1] - run.start : rng[2] - run.start]
        return out

    def _check_whole(self, buffers: dict[_Run, memoryview]) -> None:
        for run, buf in buffers.items():
            entry = self.manifest.files[run.name]
            if hash_bytes(buf, entry.algo) != entry.digest:
                raise RangeRefused(f"{run.name} {entry.algo} differs from the manifest")

    def _get_into(self, name: str, start: int, into: memoryview) -> None:
        """One ranged GET straight into `into`; StorageError becomes RangeRefused."""
        key = self.store.key(self.manifest.step, name)
        try:
            self.store.bucket.read_range_into(key, start, into)
        except (ShortReadError, ObjectNotFoundError) as err:  # the step's fault, not the bucket's
            raise RangeRefused(f"{name} bytes {start}-{start + len(into) - 1}: {err}") from err
        with self._count:
            self.fetched_bytes += len(into)

    def _get(self, name: str, start: int, length: int) -> bytes:
        """One ranged GET; StorageError becomes RangeRefused naming the file and the bytes."""
        key = self.store.key(self.manifest.step, name)
        try:
            data = self.store.bucket.get_range(key, start, length)
        except (ShortReadError, ObjectNotFoundError) as err:
            raise RangeRefused(f"{name} bytes {start}-{start + length - 1}: {err}") from err
        with self._count:
            self.fetched_bytes += len(data)
        return data
