"""A stop request in the checkpoint bucket: how `mncloud down` gives a cloud run its notice.

On the local backend `down` reaches the nodes through the supervisor's metadata server. On a
cloud nothing of mncloud runs beside the job, so `down` (and a deadline controller's budget
stop or switch) writes `STOP_REQUEST` next to the run's checkpoints; the first process of every
node reads it every `POLL_S` seconds (one small GET) and takes it as a preemption notice with
the request's deadline: every rank saves the step it reached, then exits. `down` waits for that
save (or the deadline), then cancels the job, and clears the request. A launch clears a request
left over from an earlier stop, and a request past its deadline by `STALE_S` is ignored.

    t=0    down: STOP_REQUEST {deadline: t+30}        ranks at step 812
    t≤10   a node's watcher reads it → notice          every rank saves step 815
    t≈14   step 815 COMPLETE; ranks exit               down sees the new step, cancels the job
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from mncloud.storage.checkpoints import CheckpointStore
from mncloud.storage.url import join_key

STOP_REQUEST = "STOP_REQUEST.json"
POLL_S = 10.0
"""How often a node's first process looks for a stop request."""
STALE_S = 600.0
"""A request this long past its deadline is left over from a stop that never cleared it."""


class StopRequest(BaseModel):
    """Stop after saving: by whom, when asked, and the deadline for the save."""

    by: str
    at: float
    deadline: float


def _key(store: CheckpointStore) -> str:
    return join_key(store.prefix, STOP_REQUEST)


def request_stop(store: CheckpointStore, notice_s: float, by: str) -> StopRequest:
    """Write the request: the nodes save and stop within `notice_s` seconds."""
    now = time.time()
    request = StopRequest(by=by, at=now, deadline=now + notice_s)
    store.put_note(STOP_REQUEST, request)
    return request


def read_stop_request(store: CheckpointStore, now: float | None = None) -> StopRequest | None:
    """The live request, if any (an unreadable or stale one counts as none)."""
    request = store.get_note(STOP_REQUEST, StopRequest)
    if request is None or request.deadline + STALE_S < (time.time() if now is None else now):
        return None
    return request


def clear_stop_request(store: CheckpointStore) -> None:
    """Remove the request (nothing to do when there is none)."""
    key = _key(store)
    if store.bucket.exists(key):
        store.bucket.delete(key)
