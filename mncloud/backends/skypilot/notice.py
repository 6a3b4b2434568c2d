"""A cloud run's stop notice: `down` asks the nodes to save first (see `storage/stoprequest.py`).

`give_notice` writes the stop request next to the run's checkpoints and returns when the nodes
answered it (a checkpoint step newer than the one before the request is COMPLETE, or the job
left RUNNING: its ranks exited after their save) or when the notice and a grace period are
over; `down` cancels the job after that, so nothing relaunches, and clears the request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mncloud.backends.base import RunState
from mncloud.errors import MncloudError
from mncloud.storage.checkpoints import CheckpointStore
from mncloud.storage.stoprequest import POLL_S, clear_stop_request, request_stop

log = logging.getLogger(__name__)

GRACE_S = POLL_S + 10.0
"""Beyond the notice: a node's watcher looks every `POLL_S` seconds, then the ranks exit."""
LOOK_EVERY_S = 2.0


def _newest(store: CheckpointStore) -> int | None:
    step, _ = store.latest()
    return step


def give_notice(
    ckpt_uri: str,
    notice_s: float,
    state_of: Callable[[], RunState],
    by: str = "mncloud down",
    *,
    sleep: Callable[[float], None] | None = None,
) -> int | None:
    """Ask a running job's nodes to save and stop within `notice_s`; the step they saved (None
    when no new step was committed in time). A bucket that cannot be reached: no notice.
    The wait reads this module's `time` (`sleep` defaults to its `time.sleep`), so a test
    whose nodes are faked can run it on a clock of its own."""
    store = CheckpointStore(ckpt_uri, retry_seconds=5)
    try:
        before = _newest(store)
        request_stop(store, notice_s, by)
    except MncloudError as err:
        log.warning("no stop notice (the bucket %s: %s); stopping at once", ckpt_uri, err)
        return None
    deadline = time.monotonic() + notice_s + GRACE_S
    saved: int | None = None
    while time.monotonic() < deadline:
        try:
            newest = _newest(store)
        except MncloudError:
            newest = None
        if newest is not None and (before is None or newest > before):
            saved = newest
            break
        if state_of() is not RunState.RUNNING:
            break
        (sleep or time.sleep)(LOOK_EVERY_S)
    return saved


def withdraw_notice(ckpt_uri: str) -> None:
    """Clear the stop request (after the job is cancelled; before a launch on the bucket)."""
    try:
        clear_stop_request(CheckpointStore(ckpt_uri, retry_seconds=5))
    except MncloudError as err:
        log.warning("could not clear the stop request in %s: %s", ckpt_uri, err)
