"""One deadline controller per cloud run: the queue is the lease.

A cloud controller is the SkyPilot managed job `NAME-control`. Two of them steer two training
jobs onto one checkpoint prefix and bill twice (`up --deadline --name X` twice, or `--resume`
while the first lives). So before a controller is launched, SkyPilot's queue is asked, of
every user (a controller VM may be another user to the API server), for a live `NAME-control`:

    up --deadline --name llm         → none live: launch llm-control (job 12)
    up --deadline --name llm         → job 12 live: refused, one line, exit 2, naming
                                       `mncloud status llm` and `--replace`
    up --deadline --name llm --replace
                                     → job 12 cancelled, then the training jobs of the run
                                       ids its state (in the bucket) lists; then launch anew

The queue is SkyPilot's own record of what runs: no second lock to go stale, and it sees a
controller launched from another laptop. A queue that cannot be asked refuses too (the
error says why): starting a second controller blind is what costs money.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mncloud.errors import SpecError

if TYPE_CHECKING:
    from mncloud.backends.base import ControllerHost
    from mncloud.control.state import ControlState


def live_controllers(host: ControllerHost, name: str) -> list[int]:
    """The ids of the live `NAME-control` managed jobs, of any user."""
    return [job.job_id for job in host.jobs_named(f"{name}-control") if job.live]


def take(state: ControlState) -> None:
    """Refuse a second controller for the run, or (`--replace`) end the first (see above)."""
    from mncloud.control.down import host_of

    name, host = state.name, host_of(state)
    live = live_controllers(host, name)
    if not live:
        return
    ids = ", ".join(str(i) for i in live)
    if state.existing != "replace":
        raise SpecError(
            f"run {name!r} already has a deadline controller running (SkyPilot managed job "
            f"{ids}, {name}-control); follow it with `mncloud status {name}`, or start over "
            "with `--replace` (it cancels that controller and its training job)"
        )
    _end_first(host, state, live)


def _end_first(host: ControllerHost, state: ControlState, controllers: list[int]) -> None:
    """`--replace`: cancel the live controller, then what its run launched (by run id)."""
    from mncloud.constants import RUN_ID_ENV
    from mncloud.control.state import load_uri

    host.cancel(controllers)
    old = load_uri(state.config.state_uri) if state.config.state_uri else None
    run_ids = old.run_ids if old is not None else []
    jobs = host.jobs_with_env(state.name, RUN_ID_ENV, run_ids)
    host.cancel([job.job_id for job in jobs if job.live])
