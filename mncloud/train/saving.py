"""The asynchronous save pipeline behind `CheckpointManager.save`.

One save, on each rank: the training thread copies the tensors into a free staging slot
(`staging.py`) and the ranks agree that all staged (`start`); the upload worker streams the DCP
shard and extras into S3 multipart uploads as DCP serializes them (`streaming.py`: no local
copy, hashed as the bytes pass), or - for GCS and directory buckets, or when RAM is short -
writes them to a staging folder, hashing as it writes, and uploads the files; at a later
step boundary the ranks agree that all uploaded (`finish_oldest`), and rank 0's commit thread
writes manifest.json and COMPLETE, then applies keep-last-K. Saves are committed oldest first;
`inflight` holds those not committed yet, each in its own slot.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed.checkpoint as dcp

from mncloud.errors import MncloudError, StorageError
from mncloud.storage import chunks
from mncloud.storage.checkpoints import CheckpointStore, FileEntry, Manifest
from mncloud.storage.s3 import S3Bucket
from mncloud.storage.shapes import SHAPES_KEY
from mncloud.train import profiler
from mncloud.train.collectives import Collectives
from mncloud.train.staging import (
    SaveStats,
    StagingSlots,
    count_tensors,
    hashing_filesystem,
    tensor_bytes,
)
from mncloud.train.state import (
    NO_DIST_WARNING,
    mesh_of,
    model_shapes,
    split_state,
    tensor_state,
)
from mncloud.train.streaming import PartBuffers, S3StreamFileSystem

log = logging.getLogger("mncloud.train.ckpt")  # one logger for every checkpoint message

_SHM = Path("/dev/shm")
_RAM_MARGIN = 512 * 2**20
"""RAM left free beyond a streamed save's part buffers."""


def _serialized(extras: dict[str, Any]) -> bytes:
    """A rank's extras as `torch.save` writes them (one encoding for both save paths: a file
    name would otherwise become the archive's name inside)."""
    buf = io.BytesIO()
    torch.save(extras, buf)
    return buf.getvalue()


def _without_zip_crc32() -> contextlib.AbstractContextManager[Any]:
    """Leave out the CRC32 that `torch.save` computes of every record of its zip archive (DCP
    writes each tensor with `torch.save`), for this thread's saves only.

    The manifest's content hash already covers every byte, so the CRC is a second checksum of
    the same bytes: 0.1 s of CPU per 268 MB, on 2 cores that the upload needs too. Where torch
    keeps config overrides per thread (a `ContextVar`: torch 2.13), the override reaches only
    the worker thread that writes the checkpoint; a `torch.save` of the user's on the training
    thread meanwhile keeps its CRC. Where it would be process-wide (older torch), the CRC stays
    on: a user's file written during an async save must not lose it. `torch.load` (and so DCP)
    reads archives without CRCs alike."""
    try:
        from torch.utils.serialization import config

        entry = config._config["save.compute_crc32"]
    except (ImportError, AttributeError, KeyError):
        return contextlib.nullcontext()
    if not isinstance(getattr(entry, "user_override", None), ContextVar):
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})


class Worker:
    """A one-thread executor whose thread never holds the interpreter open at exit: after a
    preemption an unfinished upload is abandoned, not waited for (`close` waits otherwise)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as err:
                    future.set_exception(err)

    def shutdown(self, wait: bool = True) -> None:
        self._queue.put(None)
        if wait:
            self._thread.join()


@dataclass
class PendingSave:
    """A save staged on every rank and not committed yet."""

    step: int
    future: Future[dict[str, FileEntry]]
    started: float
    slot: int
    """The staging slot its snapshot occupies until the future is done."""


class SavePipeline:
    """Staging slots, the upload and commit threads, and the saves in flight on this rank.

    `slots` staging slots serve periodic saves; one more is kept for an emergency save
    (`emergency.py`). Files go to `staging_dir/rank_<rank>` (a temporary folder when None,
    then removed at `close`).
    """

    def __init__(
        self,
        store: CheckpointStore,
        ranks: Collectives,
        *,
        staging_dir: str | os.PathLike[str] | None,
        slots: int,
        upload_workers: int,
        keep: int,
    ) -> None:
        self.store = store
        self.ranks = ranks
        self.n_slots = slots
        self.upload_workers = upload_workers
        self.keep = keep
        self._own_staging = staging_dir is None
        self._ram_dir: Path | None = None  # see _stage_root
        root = Path(staging_dir) if staging_dir else Path(tempfile.mkdtemp(prefix="mncloud-ckpt-"))
        self.staging_dir = root / f"rank_{ranks.rank}"
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        self._worker = Worker("mncloud-ckpt")
        self._commit_worker = Worker("mncloud-ckpt-commit")  # never queued behind an upload
        self._emergency_worker: Worker | None = None
        self.slots = StagingSlots(slots + 1)  # the last one: an emergency save's
        self.inflight: deque[PendingSave] = deque()  # uncommitted saves, oldest first
        self.stats = SaveStats()
        self._last_commit: Future[None] | None = None
        self.floor: int | None = None  # steps ≤ this exist already (the loaded step)
        self.last_save_s = 0.0
        self.last_phases: dict[str, float] = {}
        self.last_committed: int | None = None
        self.stream_uploads = True
        """Stream saves into S3 multipart uploads (no local copy) when RAM allows; off: the
        local-folder path (always taken for GCS and directory buckets)."""
        self._part_buffers: dict[str, PartBuffers] = {}
        self.mesh: dict[str, Any] = {}
        """The device mesh of the state's DTensors at the last staging ({} unsharded)."""
        self.shapes: dict[str, list[int]] = {}
        """The model tensors' global shapes at the last staging (`storage.shapes`)."""

    @property
    def pending(self) -> PendingSave | None:
        """The oldest uncommitted save (the one uploading), if any."""
        return self.inflight[0] if self.inflight else None

    def emergency_worker(self) -> Worker:
        """The thread of emergency saves (started on first use)."""
        if self._emergency_worker is None:
            self._emergency_worker = Worker("mncloud-ckpt-emergency")
        return self._emergency_worker

    # ------------------------------------------------------------------ starting a save
    def enqueue(self, step: int, state: MutableMapping[str, Any], t0: float) -> bool:
        """Start a periodic save of `step` in a free slot (blocking until the oldest save is
        committed when none is free). False when staging failed on some rank (logged)."""
        if len(self.inflight) >= self.n_slots:
            self._make_room(step)
        used = {p.slot for p in self.inflight}
        slot = next(i for i in range(self.n_slots) if i not in used)
        pending = self.start(step, state, self._worker, self.ranks.dcp_pg, t0, slot)
        if pending is None:
            return False
        self.stats.saves += 1
        self.stats.queued += bool(self.inflight)
        self.inflight.append(pending)
        return True

    def _make_room(self, step: int) -> None:
        """Every staging slot is busy: wait until the oldest save is committed (all ranks)."""
        t0 = time.perf_counter()
        oldest = self.inflight[0].step
        self.finish_oldest()
        waited = time.perf_counter() - t0
        self.stats.blocked += 1
        self.stats.blocked_s += waited
        self.stats.last_blocked_s = waited
        log.warning("checkpoint step %d waited %.2fs for step %d's upload: every staging slot "
                    "was busy (uploads take longer than the interval; consider a longer one)",
                    step, waited, oldest)  # fmt: skip

    def warm(self, state: MutableMapping[str, Any], *, background: bool) -> None:
        """Allocate the staging slots' buffers for `state` now, unless they already are. Not
        under `mncloud profile --meta`: its parameters are fake tensors (no bytes to stage, and
        their FakeTensorMode is not to be used from a second thread), and nothing is saved."""
        if (session := profiler.session()) is not None and session.meta:
            return
        try:
            tensors = tensor_state(state)
        except (MncloudError, RuntimeError) as err:  # the save itself will report it
            log.debug("not warming the staging buffers: %s", err)
            return
        if count_tensors(tensors) > self.slots.warmed_tensors:
            self.slots.warm(tensors, self.n_slots, background=background)

    def start(
        self,
        step: int,
        state: MutableMapping[str, Any],
        worker: Worker,
        pg: Any,
        t0: float,
        slot: int,
    ) -> PendingSave | None:
        """Stage on every rank, agree that all staged, hand the write and upload to `worker`."""
        error: str | None = None
        staged: Any = None
        extras: dict[str, Any] = {}
        stage_dir = self.staging_dir / f"step_{step}"
        try:
            tensors, extras = split_state(state)
            self.mesh = mesh_of(tensors)
            self.shapes = model_shapes(state, tensors)
            stage_dir = self._stage_root(tensor_bytes(tensors)) / f"step_{step}"
            shutil.rmtree(stage_dir, ignore_errors=True)
            stage_dir.mkdir(parents=True)
            staged = self.slots.stage(slot, tensors)
            self.last_phases = {"stage_s": time.perf_counter() - t0}
        except (MncloudError, OSError, RuntimeError) as err:
            error = f"{type(err).__name__}: {err}"
        failures = self.ranks.all_sum(1 if error else 0)[0]
        if failures:
            log.warning("checkpoint step %d not saved: staging failed on %d rank(s)%s; will "
                        "retry at the next interval", step, failures,
                        f" (here: {error})" if error else "")  # fmt: skip
            shutil.rmtree(stage_dir, ignore_errors=True)
            return None
        future = worker.submit(
            self._write_and_upload, step, staged, extras, stage_dir, pg, worker is not self._worker
        )
        return PendingSave(step, future, t0, slot)

    def _stage_root(self, nbytes: int) -> Path:
        """Where a save's files go before upload: memory (/dev/shm) when this pipeline owns its
        staging folder and RAM allows two copies with room to spare, else `staging_dir`."""
        if not self._own_staging or not _SHM.is_dir():
            return self.staging_dir
        need = 2 * nbytes + 2**30
        try:
            roomy = shutil.disk_usage(_SHM).free >= need
        except OSError:
            roomy = False
        if not roomy or psutil.virtual_memory().available < need:
            return self.staging_dir
        if self._ram_dir is None:
            self._ram_dir = Path(tempfile.mkdtemp(prefix="mncloud-ckpt-", dir=_SHM))
        return self._ram_dir

    def _write_and_upload(
        self,
        step: int,
        staged: dict[str, Any],
        extras: dict[str, Any],
        stage_dir: Path,
        pg: Any,
        emergency: bool = False,
    ) -> dict[str, FileEntry]:
        """Worker thread: the DCP shard and extras, streamed to the bucket or written to local
        disk then uploaded; returns their size and content hash.

        Rank 0 first removes an old COMPLETE of the same step (a rewrite must never sit under a
        stale marker). The other ranks cannot upload before that: DCP's planning collectives
        hold them until rank 0 joins. A failure there is raised only after DCP, so no rank is
        left waiting in a collective (and rank 0 then takes the folder path, uploading nothing).
        """
        uncommit_error: StorageError | None = None
        if self.ranks.rank == 0:
            try:
                self.store.uncommit(step)
            except StorageError as err:
                uncommit_error = err
        try:
            bucket = None if uncommit_error else self._streaming_bucket()
            if bucket is not None:
                return self._stream(step, staged, extras, pg, bucket, emergency)
            t0 = time.perf_counter()
            writer = dcp.FileSystemWriter(str(stage_dir), sync_files=False)
            writer.fs = fs = hashing_filesystem()  # hash while writing, not in a second pass
            self._dcp_save(staged, writer, pg)
            if uncommit_error is not None:
                raise uncommit_error
            (stage_dir / f"rank_{self.ranks.rank}.pt").write_bytes(_serialized(extras))
            files = {p.name: p for p in stage_dir.iterdir() if p.is_file()}
            t1 = time.perf_counter()
            entries = self.store.upload(
                step, files, workers=self.upload_workers, digests=fs.digests
            )
            self.last_phases.update(write_s=t1 - t0, upload_s=time.perf_counter() - t1)
            return entries
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)

    def _dcp_save(self, staged: dict[str, Any], writer: Any, pg: Any) -> None:
        with warnings.catch_warnings(), _without_zip_crc32():
            warnings.filterwarnings("ignore", message=NO_DIST_WARNING)
            dcp.save(
                staged, storage_writer=writer, process_group=pg, no_dist=not self.ranks.distributed
            )

    def _streaming_bucket(self) -> S3Bucket | None:
        """The S3 bucket to stream this save into, or None for the local-folder path: the
        bucket is not S3, streaming is off, or RAM lacks room for the part buffers."""
        bucket = self.store.bucket
        if not self.stream_uploads or not isinstance(bucket, S3Bucket):
            return None
        need = (bucket.max_concurrency + 1) * bucket.chunk_size + _RAM_MARGIN
        if psutil.virtual_memory().available < need:
            log.debug("not streaming the checkpoint: less than %d MB of RAM free", need >> 20)
            return None
        return bucket

    def _stream(
        self,
        step: int,
        staged: dict[str, Any],
        extras: dict[str, Any],
        pg: Any,
        bucket: S3Bucket,
        emergency: bool,
    ) -> dict[str, FileEntry]:
        """DCP serializes the shard straight into multipart uploads (`streaming.py`): no local
        copy. `write_s` is DCP's time, uploads included; `upload_s` the tail after it."""
        key = "emergency" if emergency else "periodic"  # an emergency save never waits on
        if key not in self._part_buffers:  # the periodic save's buffers
            size, count = bucket.chunk_size, bucket.max_concurrency + 1
            self._part_buffers[key] = PartBuffers(size, count)
        t0 = time.perf_counter()
        fs = S3StreamFileSystem(
            bucket,
            lambda name: self.store.key(step, name),
            self._part_buffers[key],
            workers=bucket.max_concurrency,
        )
        try:
            writer = dcp.FileSystemWriter(f"step_{step}", sync_files=False)
            writer.fs = fs
            self._dcp_save(staged, writer, pg)
            fs.put(f"rank_{self.ranks.rank}.pt", _serialized(extras))
            t1 = time.perf_counter()
            entries = fs.finish()
        except BaseException:
            fs.abort()
            raise
        self.last_phases.update(write_s=t1 - t0, upload_s=time.perf_counter() - t1,
                                hash_s=fs.hash_s, buffer_wait_s=fs.wait_s)  # fmt: skip
        return entries

    # ------------------------------------------------------------------ committing
    def finish_oldest(self) -> None:
        """Wait for this rank's upload, agree with the others, and (rank 0) commit."""
        if not self.inflight:
            return
        pending = self.inflight.popleft()
        entries: dict[str, FileEntry] | None = None
        error: str | None = None
        try:
            entries = pending.future.result()
        except (MncloudError, OSError, RuntimeError, ValueError) as err:
            error = f"{type(err).__name__}: {err}"
        except Exception as err:  # DCP wraps failures in its own exception types
            error = f"{type(err).__name__}: {err}"
        results = self.ranks.all_gather((entries, error))
        errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(results) if e]
        if errors:
            log.warning("checkpoint step %d failed (%s); the previous checkpoint stays; will "
                        "retry at the next interval", pending.step, "; ".join(errors))  # fmt: skip
            return
        self.last_save_s = time.perf_counter() - pending.started
        self.last_committed = pending.step
        if self.ranks.rank != 0:
            return
        manifest = self.manifest(pending.step, [entries for entries, _ in results])
        self._last_commit = self._commit_worker.submit(self._commit, manifest)

    def manifest(
        self, step: int, per_rank: list[dict[str, FileEntry] | None], **extra: Any
    ) -> Manifest:
        """The manifest of `step` from every rank's file entries."""
        files: dict[str, FileEntry] = {}
        for rank_entries in per_rank:
            files.update(rank_entries or {})
        bytes_per_rank = [sum(e.size for e in (r or {}).values()) for r in per_rank]
        mesh = {"mesh": self.mesh} if self.mesh else {}
        sidecars = all(n + chunks.SUFFIX in files for n in files if chunks.chunked(n))
        hashed = {chunks.CHUNKS_KEY: chunks.manifest_extra()} if sidecars else {}
        return Manifest(
            step=step,
            world_size=self.ranks.world_size,
            files=files,
            torch_version=torch.__version__,
            extra={
                "upload_s": round(self.last_save_s, 3),
                "bytes_per_rank": bytes_per_rank,
                **mesh,
                **hashed,
                SHAPES_KEY: self.shapes,
                **extra,
            },
        )

    def _commit(self, manifest: Manifest) -> None:
        """Commit thread on rank 0: manifest and COMPLETE; then keep-last-K, queued behind."""
        t0 = time.perf_counter()
        try:
            self.store.commit(manifest)
        except StorageError as err:
            log.warning("checkpoint step %d uploaded but not committed: %s", manifest.step, err)
            return
        self.last_phases["commit_s"] = time.perf_counter() - t0
        log.info("checkpoint step %d committed (%.1f MB)", manifest.step,
                 manifest.total_size / 1e6)  # fmt: skip
        self._commit_worker.submit(self._retain, manifest.step)

    def _retain(self, newest: int) -> None:
        """Commit thread on rank 0: keep-last-K after a commit (off `wait()`'s path)."""
        try:
            self.store.retain(self.keep, newest_verified=newest)
        except MncloudError as err:
            log.warning("checkpoint retention failed (will retry after the next save): %s", err)

    def wait(self) -> None:
        """Block until every save in flight is uploaded and committed."""
        while self.inflight:
            self.finish_oldest()
        if self._last_commit is not None:
            self._last_commit.result()

    def close(self) -> None:
        """Stop the threads (each finishes its queue first) and free the slots and folders."""
        self._worker.shutdown(wait=True)
        self._commit_worker.shutdown(wait=True)
        if self._emergency_worker is not None:
            self._emergency_worker.shutdown(wait=True)
        self.slots.close()
        self._part_buffers.clear()
        if self._own_staging:
            shutil.rmtree(self.staging_dir.parent, ignore_errors=True)
        if self._ram_dir is not None:
            shutil.rmtree(self._ram_dir, ignore_errors=True)
