"""Cancelling managed jobs by id, and waiting until SkyPilot reports them ended.

Never by name: SkyPilot's `sky.jobs.cancel(name=...)` cancels nothing when several live jobs
share the name, and says so only in its server's log (`sky/jobs/utils.py`
`cancel_job_by_name`; the request still succeeds). Two jobs of one name are ordinary here: a
deadline run relaunches under its own name, a user reruns a name. So `down` finds the ids
(from the run's record, the controller's state, or the queue, by the exact name) and cancels
those.

An example: run `llm` has jobs 7 (cancelled yesterday) and 8 (live); a controller VM launched
9 under the same name before its laptop record existed. `live_job_ids("llm")` is [8, 9];
`cancel_jobs([8, 9])` sends one cancel for both and returns [8, 9] once the queue shows both
CANCELLED; a second call finds none live and returns [] (a no-op).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.status import ask_queue
from mncloud.errors import BackendError, CancelError

WAIT_S = 180.0
"""How long `cancel_jobs` waits for SkyPilot to report the cancelled jobs ended."""
POLL_S = 2.0
"""How often it asks meanwhile."""
_FIELDS = ["job_id", "task_id", "job_name", "status"]


def _ids(job_ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in job_ids)


def _queue(what: str, **filters: Any) -> list[Any]:
    """The managed-jobs queue's records (`sky.jobs.queue_v2`), one per task. Asked by id, of
    every user: a job the laptop launched is the controller VM's to cancel, and the other way
    round, whichever user each is to the API server (a queue without `all_users` lists only
    the caller's, `sky/jobs/server/core.py`); by name, the caller's own only."""
    every_user = filters.get("job_ids") is not None
    return ask_queue(what, fields=_FIELDS, all_users=every_user, **filters)


def _live(records: list[Any]) -> list[int]:
    """The jobs with a task SkyPilot reports not ended (CANCELLING counts as live)."""
    return sorted(
        {r.job_id for r in records if r.status is not None and not r.status.is_terminal()}
    )


def jobs_named(run_name: str, live_only: bool = True) -> list[int]:
    """The ids of the managed jobs named exactly `run_name` (the queue's own name filter
    matches substrings: `llm` would find `llm-2`), the live ones only unless `live_only` is
    False."""
    records = _queue(
        f"find the managed jobs of {run_name}", skip_finished=live_only, name_match=run_name
    )
    mine = [r for r in records if r.job_name == run_name]
    return _live(mine) if live_only else sorted({r.job_id for r in mine})


def live_job_ids(run_name: str) -> list[int]:
    """The ids of the live managed jobs named exactly `run_name`."""
    return jobs_named(run_name)


def server_to_ask() -> tuple[str, bool]:
    """SkyPilot's API server (its URL) and whether to ask it about a run this machine has no
    record of: a remote one always (its errors say when it cannot be reached), a local one
    only when it already runs; the SDK would start one, and a mistyped name must not."""
    from sky.server import common

    url = common.get_server_url()
    if not common.is_api_server_local(url):
        return url, True
    return url, common.get_api_server_status(url).status is common.ApiServerStatus.HEALTHY


def cancel_jobs(
    job_ids: Iterable[int],
    *,
    wait_s: float = WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Cancel those of `job_ids` that are live, by id, and return once SkyPilot reports every
    one ended; the ids it cancelled (empty: nothing was live, a no-op).

    CancelError (with the jobs that may still be live) when SkyPilot cannot be reached
    midway or still shows a job running after `wait_s`."""
    import sky

    wanted = sorted(set(job_ids))
    if not wanted:
        return []
    live = _live(_queue(f"look up managed jobs {_ids(wanted)}", job_ids=wanted))
    if not live:
        return []
    try:
        with sky_errors(f"cancel managed jobs {_ids(live)}"):
            sky.get(sky.jobs.cancel(job_ids=live))
    except BackendError as err:
        raise CancelError(
            f"{err}; not confirmed cancelled, may still be live: managed jobs {_ids(live)}", live
        ) from None
    _wait_ended(live, wait_s, sleep)
    return live


def _wait_ended(job_ids: list[int], wait_s: float, sleep: Callable[[float], None]) -> None:
    """Poll the queue until no job of `job_ids` is live; CancelError after `wait_s`."""
    deadline = time.monotonic() + wait_s
    left = job_ids
    while True:
        try:
            left = _live(_queue(f"confirm managed jobs {_ids(left)} ended", job_ids=left))
        except BackendError as err:
            raise CancelError(
                f"cancel of managed jobs {_ids(job_ids)} sent, but {err}; not confirmed ended, "
                f"may still be live: {_ids(left)}; run `mncloud down` again",
                left,
            ) from None
        if not left:
            return
        if time.monotonic() >= deadline:
            raise CancelError(
                f"cancel of managed jobs {_ids(job_ids)} sent, but SkyPilot still shows "
                f"{_ids(left)} live after {wait_s:g}s; see `sky jobs queue`, then run "
                "`mncloud down` again",
                left,
            )
        sleep(POLL_S)
