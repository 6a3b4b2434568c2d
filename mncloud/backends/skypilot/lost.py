"""A launch whose answer was lost is *unknown*, never *failed*: resolved from the server.

`sky.jobs.launch` sends the request; `sky.stream_and_get` waits for its answer. When the wait
breaks (the API server unreachable midway, a proxy timeout), the server goes on: the job may
exist and bill. Calling that "launch failed" made `up --resume` launch a second gang on the
same checkpoints, and no record billed the first. So:

    t=0   jobs.launch sent (request r-17, its body names run id llm-…-a1b2c3), meta saved
    t=1   the stream breaks: ApiServerConnectionError
    t=2   `resolve`: `sky.get(r-17)` (the server keeps a request's answer) → job 42, adopted;
          if the server is still away, the queue is asked for the run id; if that too fails,
          `LaunchAnswerLost`: the run stays *unknown* (no error recorded), and the next
          `status` / `down` resolves it the same way before it answers

A launch the server ran and failed with a connection-type error (the cloud's API unreachable
from the server) raises what a lost answer raises; `sky.api_status` tells them apart (the
request FAILED): a failed launch (`BackendError`, SkyPilot's, never the user's code).
"""

from __future__ import annotations

from typing import Any

from mncloud.backends.skypilot.errors import translate_error
from mncloud.backends.skypilot.find import launched_jobs
from mncloud.errors import AnswerLost, BackendError


class LaunchAnswerLost(AnswerLost):
    """The launch was sent and its answer lost: the job may run. Not a failure."""


def lost_answer_errors() -> tuple[type[BaseException], ...]:
    """What a broken wait for an answer raises (the request itself may have gone through)."""
    import requests
    from sky import exceptions as sx

    return (sx.ApiServerConnectionError, requests.exceptions.RequestException,
            ConnectionError, TimeoutError)  # fmt: skip


def resolve(name: str, request_id: str, run_id: str | None) -> int | None:
    """The job id a launch request made (None: it made none), asked of the server by the
    request id, else of the queue by `run_id`; LaunchAnswerLost when neither answers."""
    import sky

    lost = lost_answer_errors()
    try:
        answer: Any = sky.get(request_id)
    except lost as err:
        if server_failed(request_id):  # the server's own error, a connection-type one
            raise translate_error(err, f"launch managed job {name}") from None
        answer = None
    except Exception as err:  # the server ran the request and it failed: a real refusal
        raise translate_error(err, f"launch managed job {name}") from None
    else:
        job_ids = answer[0] if isinstance(answer, tuple) else answer
        return int(job_ids[0]) if job_ids else None
    if run_id is not None:
        try:
            found = launched_jobs(name, run_id)
        except BackendError:
            found = None
        if found is not None:
            return found[-1].job_id if found else None
    raise LaunchAnswerLost(
        f"the launch of {name} was sent but SkyPilot's answer was lost (request {request_id}); "
        f"the job may be running: `mncloud status {name}` finds it once the API server "
        f"answers, `mncloud down {name}` stops it"
    )


def server_failed(request_id: str) -> bool:
    """Whether the API server lists request `request_id` as FAILED: it ran the launch and
    the launch failed (a cloud's API unreachable from the server raises the same
    connection-type errors as a lost answer, `sky.get` re-raising the request's error).
    False when it cannot be asked, or the request is still running or succeeded."""
    import sky

    try:
        requests = sky.api_status([request_id])
    except Exception:  # the server away: the answer is lost, not known failed
        return False
    return any(
        str(getattr(r, "request_id", "")).startswith(request_id)
        and str(getattr(r, "status", "")).upper().endswith("FAILED")
        for r in requests
    )
