"""CheckpointManager: asynchronous, verified checkpoints that survive a preemption.

    ckpt = CheckpointManager(uri=os.environ["MNCLOUD_CKPT_URI"], interval_steps=100, keep=3)
    state = {"model": model, "optimizer": opt, "step": 0, "sampler": sampler}
    start = ckpt.load(state)               # newest verified step, or None; restores in place
    for step in range(start or 0, total):
        ...
        ckpt.maybe_save(step + 1, state)   # every interval; returns at once
    ckpt.close()                           # waits for the last upload and commit

Design: the newest checkpoint is never torn. A step becomes visible only when COMPLETE is
written, and rank 0 writes it only after *every* rank reported its upload finished. Ranks agree
over a separate gloo group, on the training thread, at step boundaries, so no collective ever
runs on the training process group from another thread. Example sequence (2 ranks, interval 100):

    step 100  maybe_save: both ranks copy model/optimizer tensors to CPU memory (the only
              stall), record RNG states and the data position; an all-reduce on the gloo
              group confirms both staged. Each rank's worker thread then writes its DCP shard
              to local disk (DCP's planning collectives run on a second, private gloo group),
              hashes and uploads its files. Training continues.
    step 101+ maybe_save: one small all-reduce asks "has everyone finished uploading?" - no.
    step 117  both uploads done: the ranks exchange their file lists (size + sha256); rank 0's
              worker writes manifest.json, then COMPLETE, then applies keep-last-K.
    step 150  preempted. Step 100 is complete; a half-uploaded step would lack COMPLETE.
    restart   load(): rank 0 lists the bucket, verifies steps newest first (COMPLETE matches the
              manifest, every file present with its size; sha256 on request), skipping torn
              ones with the reason; every rank downloads and checks the files, DCP restores the
              tensors in place, then the per-rank extras and, last, the RNG states.

If an upload fails (bucket down for longer than the storage retry budget), the ranks learn it
at the agreement, the step stays uncommitted, the failure is logged, and the next interval
saves again; training never stops for storage.

No interval is skipped (see `mncloud/train/staging.py`): if a save is still uploading when the
next interval comes, the new snapshot is staged into a second slot of CPU buffers and written
as soon as that upload ends (commits stay in step order, on their own thread). Only a third
interval that finds both slots busy blocks, until the older save is committed; `stats` counts
the waits and the seconds blocked, and each block is logged. So a preemption loses at most one
interval plus the uploads in flight: one interval plus one upload when uploads are shorter than
an interval, and never three intervals' worth of steps. The buffers are allocated at `load`
(and, for an optimizer's state, in the background after the first step), so the first save
stalls no longer than later ones.

Preemption notices (`watch_preemption`, on for spot runs; see `mncloud/train/preempt.py`): the
step-boundary all-reduce also carries "has any rank a notice?" (one int beside the upload flag,
so watching costs one small gloo all-reduce per step). On a notice every rank saves that same
step at once - on a second worker thread and a third gloo group, so a periodic save still
uploading goes on beside it - waits for the upload until the earliest rank's deadline minus
`preemption_safety_s`, and rank 0 commits that step if every rank finished, else the periodic
step if that finished, else nothing (the newest COMPLETE step stays the fallback). Then every
rank writes `$MNCLOUD_PREEMPT_MARKER` and raises `Preempted` (exit code 115); unfinished uploads
are abandoned on daemon threads, so the process never waits past its deadline.

Without torch.distributed the same code runs in one process, with no collectives.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import random
import shutil
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, MutableMapping
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from mncloud.constants import (
    CKPT_STAGING_ENV,
    CKPT_URI_ENV,
    PREEMPT_MARKER_ENV,
    PREEMPTION_WATCH_ENV,
)
from mncloud.errors import CheckpointError, MncloudError, StorageError
from mncloud.storage.checkpoints import CheckpointStore, FileEntry, Manifest
from mncloud.train.preempt import Notice, Preempted, PreemptionWatcher
from mncloud.train.staging import (
    SaveStats,
    StagingSlots,
    count_tensors,
    hashing_filesystem,
    tensor_bytes,
)
from mncloud.train.steptime import report

log = logging.getLogger(__name__)

_NO_DIST_WARNING = "torch.distributed is disabled, unavailable"

_SHM = Path("/dev/shm")
_RNG_KEY = "__rng__"
_VALUE, _STATEFUL = "value", "stateful"


def rng_state() -> dict[str, Any]:
    """The python, numpy, torch CPU and CUDA RNG states of this process."""
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        out["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            log.warning("CUDA device count changed; CUDA RNG states not restored")


@dataclass
class _Pending:
    step: int
    future: Future[dict[str, FileEntry]]
    started: float
    slot: int
    """The staging slot its snapshot occupies until the future is done."""


class _Worker:
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


class CheckpointManager:
    """Save training state every `interval_steps` to a bucket; load the newest verified step.

    `uri` defaults to `$MNCLOUD_CKPT_URI`. `keep` (≥ 2) verified steps are retained.
    `verify_sha256` makes `load` hash every downloaded file (sizes are always checked).
    `async_upload=False` makes every save block until committed (for comparison or tests).
    `staging_dir` holds the local copy before upload (default `$MNCLOUD_CKPT_STAGING` or a
    temporary directory). `staging_slots` (≥ 1) CPU copies of the state may exist at once: one
    uploading, the others waiting (2: an interval that comes during an upload never blocks
    unless the one before it still waits too). `retry_seconds` is the storage retry budget per
    operation.
    `collective_timeout_s` bounds the checkpoint's own gloo collectives.

    `watch_preemption` (default: `$MNCLOUD_PREEMPTION_WATCH`, set for spot runs) starts a
    `PreemptionWatcher` and checks for a notice at every `notice_check_steps`-th `maybe_save`.
    On a notice all ranks save the same step, keep `preemption_safety_s` of the deadline for
    the commit, write `$MNCLOUD_PREEMPT_MARKER` and raise `Preempted` (exit code 115). With
    `exit_on_preemption=False`, `maybe_save` returns instead and `preempted` tells the script.
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        interval_steps: int = 100,
        keep: int = 3,
        verify_sha256: bool = False,
        async_upload: bool = True,
        staging_dir: str | os.PathLike[str] | None = None,
        upload_workers: int = 4,
        staging_slots: int = 2,
        retry_seconds: float | None = None,
        collective_timeout_s: float = 600.0,
        watch_preemption: bool | None = None,
        exit_on_preemption: bool = True,
        notice_check_steps: int = 1,
        preemption_safety_s: float = 2.0,
    ) -> None:
        uri = uri or os.environ.get(CKPT_URI_ENV)
        if not uri:
            raise CheckpointError(f"no checkpoint URI: pass uri= or set {CKPT_URI_ENV}")
        if interval_steps < 1:
            raise CheckpointError(f"interval_steps must be ≥ 1, not {interval_steps}")
        if keep < 2:
            raise CheckpointError("keep must be ≥ 2: the newest step may still be uploading")
        if staging_slots < 1:
            raise CheckpointError(f"staging_slots must be ≥ 1, not {staging_slots}")
        self.staging_slots = staging_slots
        self.uri = uri
        self.interval_steps = interval_steps
        self.keep = keep
        self.verify_sha256 = verify_sha256
        self.async_upload = async_upload
        self.upload_workers = upload_workers
        self.store = CheckpointStore(uri, retry_seconds=retry_seconds)

        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        if watch_preemption is None:
            watch_preemption = os.environ.get(PREEMPTION_WATCH_ENV, "") in ("1", "true", "yes")
        if notice_check_steps < 1:
            raise CheckpointError(f"notice_check_steps must be ≥ 1, not {notice_check_steps}")
        self.exit_on_preemption = exit_on_preemption
        self.notice_check_steps = notice_check_steps
        self.preemption_safety_s = preemption_safety_s
        self.preempted: Notice | None = None
        """Set on every rank once the ranks agreed on a preemption notice (see `Preempted`)."""
        self._agree_pg: Any = None
        self._dcp_pg: Any = None
        self._emergency_pg: Any = None  # DCP of an emergency save, beside a periodic one
        if self.distributed:
            timeout = timedelta(seconds=collective_timeout_s)
            self._agree_pg = dist.new_group(backend="gloo", timeout=timeout)
            self._dcp_pg = dist.new_group(backend="gloo", timeout=timeout)
            if watch_preemption:  # every rank has the same environment: same groups
                self._emergency_pg = dist.new_group(backend="gloo", timeout=timeout)

        base = staging_dir or os.environ.get(CKPT_STAGING_ENV)
        self._own_staging = base is None
        self._ram_dir: Path | None = None  # see _stage_root
        root = Path(base) if base else Path(tempfile.mkdtemp(prefix="mncloud-ckpt-"))
        self.staging_dir = root / f"rank_{self.rank}"
        self.staging_dir.mkdir(parents=True, exist_ok=True)

        self._worker = _Worker("mncloud-ckpt")
        self._commit_worker = _Worker("mncloud-ckpt-commit")  # never queued behind an upload
        self._emergency_worker: _Worker | None = None
        self.watcher: PreemptionWatcher | None = None
        """Watches for a preemption notice (None unless `watch_preemption`)."""
        if watch_preemption:
            self.watcher = PreemptionWatcher.from_env().start()
        self._slots = StagingSlots(staging_slots + 1)  # the last one: an emergency save's
        self._inflight: deque[_Pending] = deque()  # uncommitted saves, oldest first
        self._warm_checked = False
        self.stats = SaveStats()
        """Saves started, queued behind an upload, blocked (and for how long), stalls."""
        self._last_step = -1  # the newest step `maybe_save` was called with
        self._last_commit: Future[None] | None = None
        self._floor: int | None = None  # steps ≤ this exist already (the loaded step)
        self._closed = False
        self.last_stall_s = 0.0
        """Seconds the training thread spent in the last save call."""
        self.last_save_s = 0.0
        """Seconds from the last save call until its commit was scheduled."""
        self.last_phases: dict[str, float] = {}
        """Where the last save's time went: stage_s (training thread), write_s (DCP to the
        staging folder, hashing as it writes), upload_s, commit_s."""
        self.last_committed: int | None = None
        """The newest step this manager committed (on every rank, once agreed)."""

    @property
    def _pending(self) -> _Pending | None:
        """The oldest uncommitted save (the one uploading), if any."""
        return self._inflight[0] if self._inflight else None

    # ------------------------------------------------------------------ collectives
    def _all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._agree_pg)
        return out

    def _all_sum(self, *values: int) -> list[int]:
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self._agree_pg)
        return [int(v) for v in t.tolist()]

    def _broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self._agree_pg)
        return box[0]

    # ------------------------------------------------------------------ saving
    def maybe_save(
        self, step: int, state: MutableMapping[str, Any], *, force: bool = False
    ) -> bool:
        """Save when `step` is a multiple of `interval_steps` (or `force`); returns at once.

        Call it on every rank after every step; it also commits finished uploads and, when
        watching for preemption, acts on a notice (then it raises `Preempted`, see the class
        docstring). Returns True when a save was started. It also reports the step time for
        the straggler view (`mncloud.train.report`).
        """
        report(step)
        self._last_step = step
        if self.preempted is not None:  # stopped for a notice (exit_on_preemption=False)
            return False
        deadline = self._step_boundary(step)
        if deadline is not None:
            self._save_for_preemption(step, state, deadline)
            return True
        due = force or step % self.interval_steps == 0
        if not self._warm_checked:  # the first step made the optimizer's state: warm for it
            self._warm_checked = True
            if not due:
                self._warm(state, background=True)
        return self.save(step, state) if due else False

    def save(self, step: int, state: MutableMapping[str, Any], *, wait: bool = False) -> bool:
        """Save now. With `wait` (or `async_upload=False`), return only once committed.

        While an earlier save uploads, the snapshot waits in a free staging slot; with none
        free, this blocks until the oldest save is committed (see `stats`). Returns False when
        the step was not saved (already saved, or staging failed: logged).
        """
        if self._closed:
            raise CheckpointError("CheckpointManager is closed")
        t0 = time.perf_counter()
        if any(p.step == step for p in self._inflight):
            if wait or not self.async_upload:
                self.wait()
            return True
        if self._floor is not None and step <= self._floor:
            log.info("checkpoint step %d exists already (resumed from %d); not saved", step,
                     self._floor)  # fmt: skip
            return False
        if len(self._inflight) >= self.staging_slots:
            self._make_room(step)
        used = {p.slot for p in self._inflight}
        slot = next(i for i in range(self.staging_slots) if i not in used)
        pending = self._start_save(step, state, self._worker, self._dcp_pg, t0, slot)
        if pending is None:
            return False
        self.stats.saves += 1
        self.stats.queued += bool(self._inflight)
        self._inflight.append(pending)
        if wait or not self.async_upload:
            self.wait()
        self.last_stall_s = time.perf_counter() - t0
        if self.async_upload and not wait:
            self.stats.record_stall(self.last_stall_s)
        return True

    def _make_room(self, step: int) -> None:
        """Every staging slot is busy: wait until the oldest save is committed (all ranks)."""
        t0 = time.perf_counter()
        oldest = self._inflight[0].step
        self._finish_pending()
        waited = time.perf_counter() - t0
        self.stats.blocked += 1
        self.stats.blocked_s += waited
        self.stats.last_blocked_s = waited
        log.warning("checkpoint step %d waited %.2fs for step %d's upload: every staging slot "
                    "was busy (uploads take longer than the interval; consider a longer one)",
                    step, waited, oldest)  # fmt: skip

    def _warm(self, state: MutableMapping[str, Any], *, background: bool) -> None:
        """Allocate the staging slots' buffers for `state` now, unless they already are."""
        try:
            tensors = _tensor_state(state)
        except (MncloudError, RuntimeError) as err:  # the save itself will report it
            log.debug("not warming the staging buffers: %s", err)
            return
        if count_tensors(tensors) > self._slots.warmed_tensors:
            self._slots.warm(tensors, self.staging_slots, background=background)

    def _start_save(
        self,
        step: int,
        state: MutableMapping[str, Any],
        worker: _Worker,
        pg: Any,
        t0: float,
        slot: int,
    ) -> _Pending | None:
        """Stage on every rank, agree that all staged, hand the write and upload to `worker`."""
        error: str | None = None
        staged: Any = None
        extras: dict[str, Any] = {}
        stage_dir = self.staging_dir / f"step_{step}"
        try:
            tensors, extras = self._split(state)
            stage_dir = self._stage_root(tensor_bytes(tensors)) / f"step_{step}"
            shutil.rmtree(stage_dir, ignore_errors=True)
            stage_dir.mkdir(parents=True)
            staged = self._slots.stage(slot, tensors)
            self.last_phases = {"stage_s": time.perf_counter() - t0}
        except (MncloudError, OSError, RuntimeError) as err:
            error = f"{type(err).__name__}: {err}"
        failures = self._all_sum(1 if error else 0)[0]
        if failures:
            log.warning("checkpoint step %d not saved: staging failed on %d rank(s)%s; will "
                        "retry at the next interval", step, failures,
                        f" (here: {error})" if error else "")  # fmt: skip
            shutil.rmtree(stage_dir, ignore_errors=True)
            return None
        future = worker.submit(self._write_and_upload, step, staged, extras, stage_dir, pg)
        return _Pending(step, future, t0, slot)

    def _stage_root(self, nbytes: int) -> Path:
        """Where a save's files go before upload: memory (/dev/shm) when this manager owns its
        staging folder and RAM allows two copies with room to spare, else `staging_dir`."""
        if not self._own_staging or not _SHM.is_dir():
            return self.staging_dir
        import psutil

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

    def _split(self, state: MutableMapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Tensors for DCP (models, optimizers, tensors) and per-rank extras (the rest)."""
        tensors = _tensor_state(state)
        extras: dict[str, Any] = {}
        for key, val in state.items():
            if key in tensors:
                continue
            if callable(getattr(val, "state_dict", None)) and callable(
                getattr(val, "load_state_dict", None)
            ):
                extras[key] = (_STATEFUL, val.state_dict())
            else:
                extras[key] = (_VALUE, val)
        extras[_RNG_KEY] = (_VALUE, rng_state())
        # Detach the extras from live objects now: the worker serialises them later.
        import copy

        return tensors, copy.deepcopy(extras)

    def _write_and_upload(
        self, step: int, staged: dict[str, Any], extras: dict[str, Any], stage_dir: Path, pg: Any
    ) -> dict[str, FileEntry]:
        """Worker thread: DCP shard and extras to local disk, then hash and upload them.

        Rank 0 first removes an old COMPLETE of the same step (a rewrite must never sit under a
        stale marker). The other ranks cannot upload before that: DCP's planning collectives
        hold them until rank 0 joins. A failure there is raised only after DCP, so no rank is
        left waiting in a collective.
        """
        uncommit_error: StorageError | None = None
        if self.rank == 0:
            try:
                self.store.uncommit(step)
            except StorageError as err:
                uncommit_error = err
        try:
            t0 = time.perf_counter()
            writer = dcp.FileSystemWriter(str(stage_dir), sync_files=False)
            writer.fs = fs = hashing_filesystem()  # hash while writing, not in a second pass
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
                dcp.save(
                    staged,
                    storage_writer=writer,
                    process_group=pg,
                    no_dist=not self.distributed,
                )
            if uncommit_error is not None:
                raise uncommit_error
            torch.save(extras, stage_dir / f"rank_{self.rank}.pt")
            files = {p.name: p for p in stage_dir.iterdir() if p.is_file()}
            t1 = time.perf_counter()
            entries = self.store.upload(
                step, files, workers=self.upload_workers, digests=fs.digests
            )
            self.last_phases.update(write_s=t1 - t0, upload_s=time.perf_counter() - t1)
            return entries
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)

    def _step_boundary(self, step: int) -> float | None:
        """One all-reduce per step: commit the pending step if every rank finished uploading;
        when watching, also learn whether any rank has a preemption notice. Returns the agreed
        deadline (the earliest of any rank's) on a notice, else None."""
        watching = self.watcher is not None and step % self.notice_check_steps == 0
        if self._pending is None and not watching:
            return None
        not_done = int(self._pending is not None and not self._pending.future.done())
        has_notice = int(watching and self.watcher is not None and self.watcher.notice is not None)
        not_done, notices = self._all_sum(not_done, has_notice)
        if notices:
            own = self.watcher.notice if self.watcher is not None else None
            return self._all_min(own.deadline if own is not None else math.inf)
        if self._pending is not None and not_done == 0:
            self._finish_pending()
        return None

    def _all_min(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._agree_pg)
        return float(t.item())

    def _finish_pending(self) -> None:
        """Wait for this rank's upload, agree with the others, and (rank 0) commit."""
        if not self._inflight:
            return
        pending = self._inflight.popleft()
        entries: dict[str, FileEntry] | None = None
        error: str | None = None
        try:
            entries = pending.future.result()
        except (MncloudError, OSError, RuntimeError, ValueError) as err:
            error = f"{type(err).__name__}: {err}"
        except Exception as err:  # DCP wraps failures in its own exception types
            error = f"{type(err).__name__}: {err}"
        results = self._all_gather((entries, error))
        errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(results) if e]
        if errors:
            log.warning("checkpoint step %d failed (%s); the previous checkpoint stays; will "
                        "retry at the next interval", pending.step, "; ".join(errors))  # fmt: skip
            return
        self.last_save_s = time.perf_counter() - pending.started
        self.last_committed = pending.step
        if self.rank != 0:
            return
        manifest = self._manifest(pending.step, [entries for entries, _ in results])
        self._last_commit = self._commit_worker.submit(self._commit, manifest)

    def _manifest(
        self, step: int, per_rank: list[dict[str, FileEntry] | None], **extra: Any
    ) -> Manifest:
        files: dict[str, FileEntry] = {}
        for rank_entries in per_rank:
            files.update(rank_entries or {})
        return Manifest(
            step=step,
            world_size=self.world_size,
            files=files,
            torch_version=torch.__version__,
            extra={"upload_s": round(self.last_save_s, 3), **extra},
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

    # ------------------------------------------------------------------ preemption
    def _save_for_preemption(
        self, step: int, state: MutableMapping[str, Any], deadline: float
    ) -> None:
        """Every rank: save `step` now, commit it if every rank uploaded before the deadline,
        leave the marker, then raise `Preempted` (unless `exit_on_preemption` is off)."""
        now = time.time()
        own = self.watcher.notice if self.watcher is not None else None
        notice = own or Notice("peer", deadline, now, detail="another rank's notice")
        self.preempted = notice
        if self.rank == 0:
            log.warning("preemption notice (%s): all %d ranks save step %d; %.1fs left",
                        notice.source, self.world_size, step, deadline - now)  # fmt: skip
        committed = self.last_committed
        try:
            committed = self._emergency_save(step, state, deadline - self.preemption_safety_s)
        except Exception as err:  # a peer vanished mid-collective: stop all the same
            log.warning("emergency checkpoint of step %d abandoned: %s: %s", step,
                        type(err).__name__, err)  # fmt: skip
        marker = os.environ.get(PREEMPT_MARKER_ENV)
        if marker:
            with contextlib.suppress(OSError):
                Path(marker).touch()
        if self.exit_on_preemption:
            raise Preempted(step, committed, notice)

    def _emergency_save(self, step: int, state: MutableMapping[str, Any], end: float) -> int | None:
        """Save `step` beside a periodic save still uploading; commit the newest step every
        rank finished by `end` (epoch seconds): `step`, else a periodic one. Returns the newest
        committed step."""
        t0 = time.perf_counter()
        periodic = list(self._inflight)  # oldest first
        self._inflight.clear()
        current = next((p for p in periodic if p.step == step), None)
        if current is not None:
            periodic.remove(current)
        elif self.last_committed == step or (self._floor is not None and step <= self._floor):
            return step  # saved already
        else:
            for waiting in periodic[1:]:  # not started yet, and older than this step: drop
                waiting.future.cancel()
            busy = {p.slot for p in periodic if not p.future.done()}
            slot = next(i for i in range(self.staging_slots + 1) if i not in busy)
            if self._emergency_worker is None:
                self._emergency_worker = _Worker("mncloud-ckpt-emergency")
            pg = self._emergency_pg if self.distributed else None
            current = self._start_save(step, state, self._emergency_worker, pg, t0, slot)
        ordered = [current, *reversed(periodic)]  # newest first
        outcomes: list[tuple[Any, str | None]] = []
        for pending in ordered:  # once one finished, the older ones get no extra time
            done = any(err is None for _, err in outcomes)
            outcomes.append(_settle(pending, time.time() if done else end))
        results = self._all_gather(outcomes)
        self.last_save_s = time.perf_counter() - t0
        for which, pending in enumerate(ordered):
            outcome = [r[which] for r in results]
            if pending is None or any(err for _, err in outcome):
                continue
            ok = 1
            if self.rank == 0:
                manifest = self._manifest(pending.step, [e for e, _ in outcome], preemption=True)
                try:
                    self.store.commit(manifest)
                    log.warning("checkpoint step %d committed for the preemption (%.1fs)",
                                pending.step, self.last_save_s)  # fmt: skip
                except MncloudError as err:
                    ok = 0
                    log.warning("preemption: step %d not committed: %s", pending.step, err)
            if self._broadcast(ok) == 0:  # also: nobody exits before rank 0 committed
                break
            self.last_committed = pending.step
            return pending.step
        reasons = sorted({err for r in results for _, err in r if err})
        if self.rank == 0:
            log.warning("preemption: step %d not committed (%s); the newest checkpoint is %s",
                        step, ", ".join(reasons), self.last_committed)  # fmt: skip
        return self.last_committed

    def wait(self) -> None:
        """Block until every save in flight is uploaded and committed."""
        while self._inflight:
            self._finish_pending()
        if self._last_commit is not None:
            self._last_commit.result()

    def close(self) -> None:
        """Wait for the last upload and commit, then release the worker thread."""
        if self._closed:
            return
        if self.watcher is not None:
            self.watcher.stop()
        if self.preempted is not None:  # the VM is going away: abandon, do not wait
            self._closed = True
            return
        try:
            self.wait()
            if self.distributed:
                dist.barrier(group=self._agree_pg)
        finally:
            self._closed = True
            self._worker.shutdown(wait=True)
            self._commit_worker.shutdown(wait=True)
            if self._emergency_worker is not None:
                self._emergency_worker.shutdown(wait=True)
            self._slots.close()
            if self._own_staging:
                shutil.rmtree(self.staging_dir.parent, ignore_errors=True)
            if self._ram_dir is not None:
                shutil.rmtree(self._ram_dir, ignore_errors=True)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loading
    def load(self, state: MutableMapping[str, Any], *, step: int | None = None) -> int | None:
        """Restore `state` in place from the newest verified step (or `step`); return it.

        Torn or corrupt steps are skipped with a logged reason and older ones tried. Returns
        None (state untouched) when no step verifies. Call it on every rank. It also allocates
        the staging buffers for `state`, so the first save stalls no longer than later ones.
        """
        if self._pending is not None:
            raise CheckpointError("load() while a save is in progress; call wait() first")
        candidates: list[int] | str = []
        if self.rank == 0:
            try:
                good, skipped = self.store.candidates()
                for v in skipped:
                    log.warning("checkpoint step %d skipped: %s", v.step, v.reason)
                if step is not None:
                    good = [step] if step in good else []
                    if not good:
                        candidates = f"step {step} at {self.uri} does not verify"
                if isinstance(candidates, list):
                    candidates = good
            except MncloudError as err:
                candidates = str(err)
        candidates = self._broadcast(candidates)
        if isinstance(candidates, str):
            raise CheckpointError(candidates)
        for cand in candidates:
            local = self.staging_dir / f"load_{cand}"
            try:
                error = None
                try:
                    manifest = self._pull(cand, local)
                except MncloudError as err:
                    error = str(err)
                errors = [f"rank {r}: {e}" for r, e in enumerate(self._all_gather(error)) if e]
                if errors:
                    log.warning("checkpoint step %d skipped: %s", cand, "; ".join(errors))
                    continue
                self._restore(state, local, manifest)
            finally:
                shutil.rmtree(local, ignore_errors=True)
            self._floor = cand
            self.last_committed = cand
            log.info("resumed from checkpoint step %d at %s", cand, self.uri)
            self._warm(state, background=False)
            return cand
        log.info("no usable checkpoint at %s; starting from scratch", self.uri)
        self._warm(state, background=False)
        return None

    def _pull(self, step: int, local: Path) -> Manifest:
        manifest = self.store.read_manifest(step)
        own = f"rank_{self.rank}.pt"
        if own not in manifest.files:
            fallback = f"rank_{self.rank % max(manifest.world_size, 1)}.pt"
            log.warning("step %d was saved by %d ranks; rank %d takes %s (RNG and data position "
                        "will not match an uninterrupted run)", step, manifest.world_size,
                        self.rank, fallback)  # fmt: skip
            own = fallback
        names = [n for n in manifest.files if not n.startswith("rank_")] + [own]
        self.store.pull(step, local, names=names, sha256=self.verify_sha256)
        (local / "extras.pt").symlink_to(local / own)
        return manifest

    def _restore(self, state: MutableMapping[str, Any], local: Path, manifest: Manifest) -> None:
        modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
        targets = _tensor_state(state)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
                dcp.load(
                    targets,
                    storage_reader=dcp.FileSystemReader(str(local)),
                    process_group=self._dcp_pg,
                    no_dist=not self.distributed,
                )
        except Exception as err:
            raise CheckpointError(
                f"step {manifest.step} does not fit this model/optimizer: {err}"
            ) from err
        for key, val in state.items():
            if isinstance(val, torch.nn.Module):
                set_model_state_dict(val, targets[key])
            elif isinstance(val, torch.optim.Optimizer):
                set_optimizer_state_dict(_owner(val, modules, key), val, targets[key])
        extras = torch.load(local / "extras.pt", weights_only=False)
        for key, (kind, value) in extras.items():
            if key == _RNG_KEY:
                continue
            current = state.get(key)
            if kind == _STATEFUL and current is not None and hasattr(current, "load_state_dict"):
                current.load_state_dict(value)
            elif isinstance(current, dict) and isinstance(value, dict):
                current.clear()
                current.update(value)
            else:
                state[key] = value
        set_rng_state(extras[_RNG_KEY][1])  # last: nothing after this may draw random numbers


def _settle(pending: _Pending | None, until: float) -> tuple[Any, str | None]:
    """A save's file entries if it finished by `until` (epoch seconds), else why not."""
    if pending is None:
        return None, "not saved"
    try:
        return pending.future.result(timeout=max(0.0, until - time.time())), None
    except FutureTimeout:
        return None, "deadline"
    except CancelledError:
        return None, "superseded"
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"


def _tensor_state(state: MutableMapping[str, Any]) -> dict[str, Any]:
    """The part of `state` DCP saves and loads: models, optimizers and plain tensors."""
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    tensors: dict[str, Any] = {}
    for key, val in state.items():
        if isinstance(val, torch.nn.Module):
            tensors[key] = get_model_state_dict(val)
        elif isinstance(val, torch.optim.Optimizer):
            tensors[key] = get_optimizer_state_dict(_owner(val, modules, key), val)
        elif isinstance(val, torch.Tensor):
            tensors[key] = val
    return tensors


def _owner(opt: torch.optim.Optimizer, modules: list[torch.nn.Module], key: str) -> Any:
    """The module in the state whose parameters the optimizer updates."""
    first = next((p for g in opt.param_groups for p in g["params"]), None)
    for m in modules:
        if first is None or any(p is first for p in m.parameters()):
            return m
    raise CheckpointError(
        f"optimizer {key!r} updates parameters of no model in the state; put the model in too"
    )


with contextlib.suppress(Exception):  # keep DCP's own per-save info logs quiet by default
    logging.getLogger("torch.distributed.checkpoint").setLevel(logging.WARNING)
