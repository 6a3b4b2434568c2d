"""`status` of a cloud deadline run asks SkyPilot how its controller is, not only the state.

The state in the bucket is what the controller last wrote; a controller SkyPilot marked FAILED
(its restarts spent), or one cancelled with `sky jobs cancel`, writes nothing more, and its
run read RUNNING forever. So the laptop's `status` looks up the controller's managed job:

    state: phase spot, controller job 12     queue: job 12 FAILED
    → phase failed: "its controller (SkyPilot managed job 12) is FAILED: nothing steers the
      run; `mncloud down llm` stops what it launched"

A queue that cannot be asked (or a local API server not running) leaves the state as it is.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from mncloud.errors import MncloudError

if TYPE_CHECKING:
    from mncloud.backends.base import ControllerHost
    from mncloud.control.state import ControlState


def checked(state: ControlState) -> ControlState:
    """`state`, marked ended when SkyPilot reports its controller's job ended (see above)."""
    job_id = state.controller_job_id
    if state.final or job_id is None:
        return state
    from mncloud.backends.registry import get_backend

    backend = get_backend(state.config.backend)
    if backend.runs_here:  # its controller is a process here
        return state
    ended = None
    with contextlib.suppress(MncloudError):
        ended = _ended_as(backend.controller_host(), job_id)
    if ended is None:
        return state
    from mncloud.control.state import save_state
    from mncloud.deadline.policy import Mode

    state.phase = "stopped" if ended.startswith("CANCEL") else "failed"
    state.market = state.mode = Mode.NONE
    state.detail = (
        f"its controller (SkyPilot managed job {job_id}) is {ended}: nothing steers the run; "
        f"`mncloud down {state.name}` stops what it launched"
    )
    save_state(state)
    return state


def _ended_as(host: ControllerHost, job_id: int) -> str | None:
    """SkyPilot's terminal state of managed job `job_id`, or None (live, unknown, unasked)."""
    if not host.may_ask():
        return None
    job = host.job_states([job_id]).get(job_id)
    if job is None or not job.statuses or job.live:
        return None
    return job.statuses[0]
