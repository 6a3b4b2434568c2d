"""The emergency save on a preemption notice: the step every rank is at, saved at once.

When the ranks agree on a notice (`CheckpointManager.maybe_save`), every rank saves that same
step on a second worker thread and the emergency gloo group, so a periodic save still uploading
goes on beside it. Each rank waits for its uploads until the end of the time left (the
earliest deadline minus the safety margin); then rank 0 commits the newest step every rank
finished: the notice's step, else a periodic one, else nothing (the newest COMPLETE step stays
the fallback). Saves still uploading are abandoned on their daemon threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import MutableMapping
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mncloud.constants import PREEMPT_MARKER_ENV, STOP_POLL_ENV
from mncloud.errors import MncloudError
from mncloud.train.collectives import Collectives
from mncloud.train.preempt import Notice, PreemptionWatcher
from mncloud.train.saving import PendingSave, SavePipeline

if TYPE_CHECKING:
    from mncloud.storage.checkpoints import CheckpointStore

log = logging.getLogger("mncloud.train.ckpt")  # one logger for every checkpoint message


def agreed_notice(watcher: PreemptionWatcher | None, deadline: float, now: float) -> Notice:
    """This rank's own notice, else one that stands for another rank's (`deadline`)."""
    own = watcher.notice if watcher is not None else None
    return own or Notice("peer", deadline, now, detail="another rank's notice")


def watch_stop_requests(watcher: PreemptionWatcher, store: CheckpointStore) -> None:
    """Take a stop request in the run's bucket (`mncloud down` of a cloud run) as a notice."""
    from mncloud.storage.stoprequest import POLL_S, read_stop_request

    def check() -> Notice | None:
        request = read_stop_request(store)
        if request is None:
            return None
        return Notice("stop-request", request.deadline, time.time(), detail=request.by)

    poll_s = float(os.environ.get(STOP_POLL_ENV) or POLL_S)
    watcher.watch_source("stop-request", check, poll_s)


def leave_marker() -> None:
    """Touch `$MNCLOUD_PREEMPT_MARKER` (if set): the launcher's sign of a preemption exit."""
    marker = os.environ.get(PREEMPT_MARKER_ENV)
    if marker:
        with contextlib.suppress(OSError):
            Path(marker).touch()


def emergency_save(
    saving: SavePipeline,
    ranks: Collectives,
    step: int,
    state: MutableMapping[str, Any],
    end: float,
) -> int | None:
    """Save `step` beside a periodic save still uploading; commit the newest step every rank
    finished by `end` (epoch seconds): `step`, else a periodic one. Returns the newest
    committed step."""
    t0 = time.perf_counter()
    periodic = list(saving.inflight)  # oldest first
    saving.inflight.clear()
    current = next((p for p in periodic if p.step == step), None)
    if current is not None:
        periodic.remove(current)
    elif saving.last_committed == step or (saving.floor is not None and step <= saving.floor):
        return step  # saved already
    else:
        current = _start_beside(saving, ranks, step, state, periodic, t0)
    ordered = [current, *reversed(periodic)]  # newest first
    outcomes: list[tuple[Any, str | None]] = []
    for pending in ordered:  # once one finished, the older ones get no extra time
        done = any(err is None for _, err in outcomes)
        outcomes.append(settle(pending, time.time() if done else end))
    results = ranks.all_gather(outcomes)
    saving.last_save_s = time.perf_counter() - t0
    committed = _commit_newest(saving, ranks, ordered, results)
    if committed is not None:
        return committed
    reasons = sorted({err for r in results for _, err in r if err})
    if ranks.rank == 0:
        log.warning("preemption: step %d not committed (%s); the newest checkpoint is %s",
                    step, ", ".join(reasons), saving.last_committed)  # fmt: skip
    return saving.last_committed


def _start_beside(
    saving: SavePipeline,
    ranks: Collectives,
    step: int,
    state: MutableMapping[str, Any],
    periodic: list[PendingSave],
    t0: float,
) -> PendingSave | None:
    """Stage `step` into a slot no upload uses, on the emergency thread and group; periodic
    saves not started yet (older than this step) are dropped."""
    for waiting in periodic[1:]:
        waiting.future.cancel()
    busy = {p.slot for p in periodic if not p.future.done()}
    slot = next(i for i in range(saving.n_slots + 1) if i not in busy)
    pg = ranks.emergency_pg if ranks.distributed else None
    return saving.start(step, state, saving.emergency_worker(), pg, t0, slot)


def _commit_newest(
    saving: SavePipeline,
    ranks: Collectives,
    ordered: list[PendingSave | None],
    results: list[list[tuple[Any, str | None]]],
) -> int | None:
    """Rank 0 commits the newest of `ordered` that every rank finished; every rank learns
    whether it did (so nobody exits before). The committed step, or None."""
    for which, pending in enumerate(ordered):
        outcome = [r[which] for r in results]
        if pending is None or any(err for _, err in outcome):
            continue
        ok = 1
        if ranks.rank == 0:
            manifest = saving.manifest(pending.step, [e for e, _ in outcome], preemption=True)
            try:
                saving.store.commit(manifest)
                log.warning("checkpoint step %d committed for the preemption (%.1fs)",
                            pending.step, saving.last_save_s)  # fmt: skip
            except MncloudError as err:
                ok = 0
                log.warning("preemption: step %d not committed: %s", pending.step, err)
        if ranks.broadcast(ok) == 0:
            return None
        saving.last_committed = pending.step
        return pending.step
    return None


def settle(pending: PendingSave | None, until: float) -> tuple[Any, str | None]:
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
