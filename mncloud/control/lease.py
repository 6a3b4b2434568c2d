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

Two more ways to a second controller, refused the same way (`--replace` ends them first):
an `up` cut short while its controller's launch request was in flight (the API server goes
on with it: listed by `sky.api_status`, not yet in the queue), and a controller that died
(FAILED past its restarts) while the training job it launched trains on (found by the run
ids its state in the bucket lists: a new controller would overwrite that state and launch a
second job beside it).

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
    replace = state.existing == "replace"
    flying = host.launches_in_flight(f"{name}-control", wait=replace)
    if flying and not replace:
        raise SpecError(
            f"run {name!r} has a deadline controller still being launched (SkyPilot request "
            f"{', '.join(flying)}, from an `up` cut short); follow it with `mncloud status "
            f"{name}` and stop it with `mncloud down {name}` once it runs, or start over with "
            "`--replace` (it waits for that launch, then cancels it and its training job)"
        )
    live = live_controllers(host, name)
    if not live:
        _left_unsteered(host, state)
        return
    ids = ", ".join(str(i) for i in live)
    if not replace:
        raise SpecError(
            f"run {name!r} already has a deadline controller running (SkyPilot managed job "
            f"{ids}, {name}-control); follow it with `mncloud status {name}`, or start over "
            "with `--replace` (it cancels that controller and its training job)"
        )
    _end_first(host, state, live)


def _left_unsteered(host: ControllerHost, state: ControlState) -> None:
    """No controller runs, but the training jobs the last one launched may (it died, FAILED
    past its restarts, while its job trained on): a new controller would overwrite its state
    and launch a second job beside them. Refused, or (`--replace`) cancelled first."""
    from mncloud.constants import RUN_ID_ENV

    run_ids = _run_ids(state)
    jobs = [j.job_id for j in host.jobs_with_env(state.name, RUN_ID_ENV, run_ids) if j.live]
    if not jobs:
        return
    if state.existing == "replace":
        host.cancel(jobs)
        return
    name, ids = state.name, ", ".join(str(i) for i in jobs)
    raise SpecError(
        f"run {name!r} still has training job {ids} live (SkyPilot managed job), launched by "
        f"a deadline controller that no longer runs: nothing steers it; stop it with "
        f"`mncloud down {name}` and then `up --deadline --resume`, or start over with "
        "`--replace` (it cancels that job)"
    )


def _run_ids(state: ControlState) -> list[str]:
    """The run ids the run's last controller launched or journaled (its state in the bucket)."""
    from mncloud.control.state import load_uri

    old = load_uri(state.config.state_uri) if state.config.state_uri else None
    if old is None:
        return []
    journaled = [old.launching.run_id] if old.launching and old.launching.run_id else []
    return [*old.run_ids, *journaled]


def _end_first(host: ControllerHost, state: ControlState, controllers: list[int]) -> None:
    """`--replace`: cancel the live controller, then what its run launched (by run id)."""
    from mncloud.constants import RUN_ID_ENV

    host.cancel(controllers)
    jobs = host.jobs_with_env(state.name, RUN_ID_ENV, _run_ids(state))
    host.cancel([job.job_id for job in jobs if job.live])
