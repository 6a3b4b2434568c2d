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
              group confirms both staged. Each rank's worker thread then has DCP serialize
              its shard (DCP's planning collectives run on a second, private gloo group)
              straight into S3 multipart uploads, hashing as the bytes pass (GCS and
              directory buckets, or short RAM: to a local folder, then uploaded). Training
              continues.
    step 101+ maybe_save: one small all-reduce asks "has everyone finished uploading?" - no.
    step 117  both uploads done: the ranks exchange their file lists (size + content hash); rank 0's
              worker writes manifest.json, then COMPLETE, then applies keep-last-K.
    step 150  preempted. Step 100 is complete; a half-uploaded step would lack COMPLETE.
    restart   load(): rank 0 lists the bucket, verifies steps newest first (COMPLETE matches the
              manifest, every file present with its size), skipping torn ones with the reason,
              and reads the step's DCP metadata once for every rank; DCP plans what each rank
              loads, and the bucket reader (`reader.py`) fetches each saved item once, by one
              of the ranks that need it, as ranged reads checked against the chunk hashes
              written at save (`storage/chunks.py`), then hands it to the other ranks that need
              it. Only once every rank's reads verified are the tensors restored in place, then
              the per-rank extras and, last, the RNG states; a range that fails refuses the
              step (file and bytes named) and the next older one is tried.

If an upload fails (bucket down for longer than the storage retry budget), the ranks learn it
at the agreement, the step stays uncommitted, the failure is logged, and the next interval
saves again; training never stops for storage.

The save pipeline is `saving.py` (staging slots: `staging.py`), the emergency save
`emergency.py`, what of the state goes where `state.py`, the gloo groups `collectives.py`.

No interval is skipped (see `mncloud/train/staging.py`): if a save is still uploading when the
next interval comes, the new snapshot is staged into a second slot of CPU buffers and written
as soon as that upload ends (commits stay in step order, on their own thread). Only a third
interval that finds both slots busy blocks, until the older save is committed; `stats` counts
the waits and the seconds blocked, and each block is logged. So a preemption loses at most one
interval plus the uploads in flight: one interval plus one upload when uploads are shorter than
an interval, and never three intervals' worth of steps. The buffers are allocated in the
background from `load` on (and, for an optimizer's state, after the first step), so neither
a resume nor the first save waits for them.

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
import time
from collections.abc import MutableMapping
from typing import Any

from mncloud.constants import CKPT_STAGING_ENV, CKPT_URI_ENV, PREEMPTION_WATCH_ENV
from mncloud.errors import CheckpointError, MncloudError
from mncloud.storage.checkpoints import CheckpointStore
from mncloud.train import profiler
from mncloud.train.collectives import Collectives
from mncloud.train.emergency import (
    agreed_notice,
    emergency_save,
    leave_marker,
    watch_stop_requests,
)
from mncloud.train.ft import Replicas
from mncloud.train.preempt import Notice, Preempted, PreemptionWatcher
from mncloud.train.resume import Resume
from mncloud.train.saving import PendingSave, SavePipeline
from mncloud.train.staging import SaveStats, StagingSlots
from mncloud.train.state import rng_state, set_rng_state
from mncloud.train.steptime import report

__all__ = ["CheckpointManager", "rng_state", "set_rng_state"]

log = logging.getLogger(__name__)


class CheckpointManager:
    """Save training state every `interval_steps` to a bucket; load the newest verified step.

    `uri` defaults to `$MNCLOUD_CKPT_URI`. `keep` (≥ 2) verified steps are retained.
    `load` checks every byte it reads against the step's hashes: each range of a shard file
    against its chunk hashes, the small files whole. `verify_sha256` matters only for steps
    saved before chunk hashes existed: it reads each shard file a rank needs whole and checks
    its whole-file hash (else their ranges are checked by size).
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

    `replicas` (node recovery, `mncloud.train.Replicas`): only the quorum's first replica
    saves (the others hold the same bits), and notices are not watched (a node told it goes
    is replaced while its peers train on).
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
        replicas: Replicas | None = None,
    ) -> None:
        uri = _checked_uri(uri, interval_steps, keep, staging_slots, notice_check_steps)
        self.staging_slots = staging_slots
        self.uri = uri
        self.interval_steps = interval_steps
        self.verify_sha256 = verify_sha256
        self.async_upload = async_upload
        store = CheckpointStore(uri, retry_seconds=retry_seconds)
        self.replicas = replicas if replicas is not None and replicas.enabled else None
        if watch_preemption is None:
            watch_preemption = os.environ.get(PREEMPTION_WATCH_ENV, "") in ("1", "true", "yes")
        if self.replicas is not None:  # a node told it goes is replaced; its peers hold the state
            watch_preemption = False
        self._ranks = Collectives(collective_timeout_s, emergency=watch_preemption)
        self.distributed = self._ranks.distributed
        self.rank = self._ranks.rank
        self.world_size = self._ranks.world_size
        self.exit_on_preemption = exit_on_preemption
        self.notice_check_steps = notice_check_steps
        self.preemption_safety_s = preemption_safety_s
        self.preempted: Notice | None = None
        """Set on every rank once the ranks agreed on a preemption notice (see `Preempted`)."""
        self._saving = SavePipeline(
            store,
            self._ranks,
            staging_dir=staging_dir or os.environ.get(CKPT_STAGING_ENV),
            slots=staging_slots,
            upload_workers=upload_workers,
            keep=keep,
        )
        self.staging_dir = self._saving.staging_dir
        self.watcher: PreemptionWatcher | None = None
        """Watches for a preemption notice (None unless `watch_preemption`)."""
        if watch_preemption:
            self.watcher = PreemptionWatcher.from_env().start()
            watch_stop_requests(self.watcher, store)
        self._warm_checked = False
        self._closed = False
        self.last_stall_s = 0.0
        """Seconds the training thread spent in the last save call."""

    # ------------------------------------------------------------------ kept by the pipeline
    @property
    def store(self) -> CheckpointStore:
        """The bucket's checkpoints (settable, e.g. to a store on another bucket object)."""
        return self._saving.store

    @store.setter
    def store(self, store: CheckpointStore) -> None:
        self._saving.store = store

    @property
    def keep(self) -> int:
        """How many verified steps are retained."""
        return self._saving.keep

    @keep.setter
    def keep(self, keep: int) -> None:
        self._saving.keep = keep

    @property
    def upload_workers(self) -> int:
        """Files of one rank uploaded at once."""
        return self._saving.upload_workers

    @upload_workers.setter
    def upload_workers(self, n: int) -> None:
        self._saving.upload_workers = n

    @property
    def stats(self) -> SaveStats:
        """Saves started, queued behind an upload, blocked (and for how long), stalls."""
        return self._saving.stats

    @property
    def last_save_s(self) -> float:
        """Seconds from the last save call until its commit was scheduled."""
        return self._saving.last_save_s

    @property
    def last_phases(self) -> dict[str, float]:
        """Where the last save's time went: stage_s (training thread), write_s (DCP, hashing
        as it writes; when streaming, the uploads running meanwhile too), upload_s (the upload
        left after DCP), commit_s; streamed saves add hash_s and buffer_wait_s (the writer
        waiting for a free part buffer)."""
        return self._saving.last_phases

    @property
    def last_committed(self) -> int | None:
        """The newest step this manager committed (on every rank, once agreed)."""
        return self._saving.last_committed

    @property
    def _pending(self) -> PendingSave | None:
        """The oldest uncommitted save (the one uploading), if any."""
        return self._saving.pending

    @property
    def _slots(self) -> StagingSlots:
        return self._saving.slots

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
        if (session := profiler.session()) is not None:  # `mncloud profile`: a step ended
            session.step_done(state)
            session.step_started(step + 1, state, None)
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
                self._saving.warm(state, background=True)
        return self.save(step, state) if due else False

    def save(self, step: int, state: MutableMapping[str, Any], *, wait: bool = False) -> bool:
        """Save now. With `wait` (or `async_upload=False`), return only once committed.

        While an earlier save uploads, the snapshot waits in a free staging slot; with none
        free, this blocks until the oldest save is committed (see `stats`). Returns False when
        the step was not saved (already saved, or staging failed: logged).
        """
        if self._closed:
            raise CheckpointError("CheckpointManager is closed")
        if self.replicas is not None and not self.replicas.saves:
            return False  # node recovery: the quorum's first replica writes the bucket's copy
        t0 = time.perf_counter()
        if any(p.step == step for p in self._saving.inflight):
            if wait or not self.async_upload:
                self.wait()
            return True
        if self.replicas is not None and self._committed_by_another(step):
            if wait:  # the last save: end on the bits the quorum committed, not our own
                self.load(state, step=step)
            return False
        floor = self._saving.floor
        if floor is not None and step <= floor:
            log.info("checkpoint step %d exists already (resumed from %d); not saved", step,
                     floor)  # fmt: skip
            return False
        if not self._saving.enqueue(step, state, t0):
            return False
        if wait or not self.async_upload:
            self.wait()
        self.last_stall_s = time.perf_counter() - t0
        if self.async_upload and not wait:
            self.stats.record_stall(self.last_stall_s)
        return True

    def _committed_by_another(self, step: int) -> bool:
        """Node recovery: `step` is COMPLETE in the bucket, written by another replica (one that
        finished, say, while this one trained alone after joining late). It is never written
        again: a committed step is never overwritten. Asked by rank 0, agreed by every rank."""
        if step == self.last_committed:
            return False
        found: bool | str = False
        if self.rank == 0:
            try:
                found = any(i.step == step and i.complete for i in self.store.steps())
            except MncloudError as err:
                found = f"cannot list {self.uri}: {err}"
        found = self._ranks.broadcast(found)
        if isinstance(found, str):
            log.warning("checkpoint step %d not checked: %s", step, found)
            return False
        return bool(found)

    def _step_boundary(self, step: int) -> float | None:
        """One all-reduce per step: commit the pending step if every rank finished uploading;
        when watching, also learn whether any rank has a preemption notice. Returns the agreed
        deadline (the earliest of any rank's) on a notice, else None."""
        watching = self.watcher is not None and step % self.notice_check_steps == 0
        pending = self._saving.pending
        if pending is None and not watching:
            return None
        not_done = int(pending is not None and not pending.future.done())
        has_notice = int(watching and self.watcher is not None and self.watcher.notice is not None)
        not_done, notices = self._ranks.all_sum(not_done, has_notice)
        if notices:
            own = self.watcher.notice if self.watcher is not None else None
            return self._ranks.all_min(own.deadline if own is not None else math.inf)
        if pending is not None and not_done == 0:
            self._saving.finish_oldest()
        return None

    def _save_for_preemption(
        self, step: int, state: MutableMapping[str, Any], deadline: float
    ) -> None:
        """Every rank: save `step` now, commit it if every rank uploaded before the deadline,
        leave the marker, then raise `Preempted` (unless `exit_on_preemption` is off)."""
        now = time.time()
        notice = self.preempted = agreed_notice(self.watcher, deadline, now)
        if self.rank == 0:
            log.warning("preemption notice (%s): all %d ranks save step %d; %.1fs left",
                        notice.source, self.world_size, step, deadline - now)  # fmt: skip
        committed = self.last_committed
        end = deadline - self.preemption_safety_s
        try:
            committed = emergency_save(self._saving, self._ranks, step, state, end)
        except Exception as err:  # a peer vanished mid-collective: stop all the same
            log.warning("emergency checkpoint of step %d abandoned: %s: %s", step,
                        type(err).__name__, err)  # fmt: skip
        leave_marker()
        if self.exit_on_preemption:
            raise Preempted(step, committed, notice)

    def wait(self) -> None:
        """Block until every save in flight is uploaded and committed."""
        self._saving.wait()

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
            self._ranks.barrier()
        finally:
            self._closed = True
            self._saving.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loading
    def load(self, state: MutableMapping[str, Any], *, step: int | None = None) -> int | None:
        """Restore `state` in place from the newest verified step (or `step`); return it.

        Torn or corrupt steps are skipped with a logged reason and older ones tried. Returns
        None (state untouched) when no step verifies. Call it on every rank. It also starts
        allocating the staging buffers for `state` in the background (pinning them took 2.3 s
        for a 3 GB state on an H100 machine), so training resumes at once; a save before they
        are all there waits for the rest, later ones do not.
        """
        if self._pending is not None:
            raise CheckpointError("load() while a save is in progress; call wait() first")
        loaded = Resume(self.store, self._ranks, verify_sha256=self.verify_sha256,
                        spill_dir=self.staging_dir).load(state, step)  # fmt: skip
        if loaded is not None:
            self._saving.floor = loaded
            self._saving.last_committed = loaded
        self._saving.warm(state, background=True)
        return loaded


def _checked_uri(
    uri: str | None, interval_steps: int, keep: int, staging_slots: int, notice_check_steps: int
) -> str:
    """The checkpoint URI (`uri`, else `$MNCLOUD_CKPT_URI`); CheckpointError for the first
    argument out of range."""
    uri = uri or os.environ.get(CKPT_URI_ENV)
    if not uri:
        raise CheckpointError(f"no checkpoint URI: pass uri= or set {CKPT_URI_ENV}")
    if interval_steps < 1:
        raise CheckpointError(f"interval_steps must be ≥ 1, not {interval_steps}")
    if keep < 2:
        raise CheckpointError("keep must be ≥ 2: the newest step may still be uploading")
    if staging_slots < 1:
        raise CheckpointError(f"staging_slots must be ≥ 1, not {staging_slots}")
    if notice_check_steps < 1:
        raise CheckpointError(f"notice_check_steps must be ≥ 1, not {notice_check_steps}")
    return uri


with contextlib.suppress(Exception):  # keep DCP's own per-save info logs quiet by default
    logging.getLogger("torch.distributed.checkpoint").setLevel(logging.WARNING)
