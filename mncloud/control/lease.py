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
on with it: listed by `sky.api_status`, not yet in the queue; `--replace` waits for it,
`LAUNCH_WAIT_S` at most, else refuses with nothing done), and a controller that died
(FAILED past its restarts) while the training job it launched trains on (found by the run
ids its state in the bucket lists: a new controller would overwrite that state and launch a
second job beside it).

And one way to a second training job: the last controller died (or `--replace` cancels it)
while its training launch was still in flight at the API server, which goes on with it. So
before a new controller takes the run, every unfinished `sky.jobs.launch` request naming one
of the run ids of the old state (in the bucket) is waited for, `LAUNCH_WAIT_S` at most, and
only then is the queue asked for their jobs; the new state keeps those run ids
(`earlier_run_ids`), so `down` and the next `up` look for them too, and the new controller
does so again before it launches (`recovery.earlier_launches`: a request this `up` could not
see, another API user's, is waited for there):

    t=0     controller (job 12) journals run id llm-…-a1b2, sends `sky.jobs.launch`, dies
    t=60    up --deadline --name llm --resume: the request is in flight: waited for
    t=90    the server finishes it: training job 14, PENDING; nothing steered it yet (the
            launch was journaled, never recorded): cancelled; then llm-control launched
    (or)    still in flight at t=660: refused in one line, exit 2, nothing launched

`--resume` cancels only such a launch the dead controller never recorded; a training job it
steered is refused as above (`mncloud down` gives it the stop notice first). `--replace`
cancels both.

The queue is SkyPilot's own record of what runs: no second lock to go stale, and it sees a
controller launched from another laptop. A queue that cannot be asked refuses too (the
error says why): starting a second controller blind is what costs money.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mncloud.errors import SpecError

if TYPE_CHECKING:
    from mncloud.backends.base import ControllerHost
    from mncloud.control.state import ControlState

#: How long a new controller waits for a launch of the run's last controller still in flight
#: at the API server (a managed job's launch request ends once the job is submitted), and how
#: often it looks meanwhile.
LAUNCH_WAIT_S = 600.0
LAUNCH_POLL_S = 5.0


def pause(seconds: float) -> None:
    """Between two looks at the last controller's launches in flight (tests: a fake clock)."""
    time.sleep(seconds)


def live_controllers(host: ControllerHost, name: str) -> list[int]:
    """The ids of the live `NAME-control` managed jobs, of any user."""
    return [job.job_id for job in host.jobs_named(f"{name}-control") if job.live]


def take(state: ControlState) -> None:
    """Refuse a second controller for the run, or (`--replace`) end the first (see above)."""
    from mncloud.control.down import host_of

    name, host = state.name, host_of(state)
    replace = state.existing == "replace"
    flying = host.launches_in_flight(f"{name}-control")
    if flying and replace:  # waited for, within the bound: then the queue lists what it made
        _settled_controllers(host, name, flying)
    elif flying:
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


def _settled_controllers(host: ControllerHost, name: str, flying: list[str]) -> None:
    """`--replace`: the controller launches in flight (an `up` cut short) waited for,
    `LAUNCH_WAIT_S` at most; SpecError, nothing launched or cancelled, when one is not done."""
    left = host.settle_requests(flying, wait_s=LAUNCH_WAIT_S, poll_s=LAUNCH_POLL_S, sleep=pause)
    _refuse_in_flight(name, "a deadline controller's launch (from an `up` cut short)", left,
                      "nothing was launched or cancelled", "up --replace")  # fmt: skip


def _refuse_in_flight(name: str, what: str, left: list[str], done: str, again: str) -> None:
    """SpecError naming the launch requests `left` in flight after the wait (none: nothing)."""
    if left:
        ids = " ".join(left)
        raise SpecError(
            f"run {name!r}: {what} is still in flight at the SkyPilot API server after "
            f"{LAUNCH_WAIT_S:g}s (request {ids}); {done}: run this `{again}` again once it "
            f"ends (`sky api status`), or cancel it first (`sky api cancel {ids}`)"
        )


def _left_unsteered(host: ControllerHost, state: ControlState) -> None:
    """No controller runs, but the training jobs the last one launched may (it died, FAILED
    past its restarts, while its job trained on, or while its launch was in flight): a new
    controller would overwrite its state and launch a second job beside them. Refused, or
    cancelled first: by `--replace`, and by `--resume` when only a launch the last
    controller journaled and never recorded made them (nothing steered them yet)."""
    old = _old_state(state)
    run_ids = _settled(host, state, old)
    unrecorded = old.launching.run_id if old is not None and old.launching else None
    steered = live_jobs(host, state.name, [r for r in run_ids if r != unrecorded])
    unsteered = live_jobs(host, state.name, [unrecorded] if unrecorded else [])
    if state.existing == "replace" or (state.existing == "resume" and not steered):
        host.cancel([*steered, *unsteered])
        return
    if not steered and not unsteered:
        return
    name, ids = state.name, ", ".join(str(i) for i in [*steered, *unsteered])
    raise SpecError(
        f"run {name!r} still has training job {ids} live (SkyPilot managed job), launched by "
        f"a deadline controller that no longer runs: nothing steers it; stop it with "
        f"`mncloud down {name}` and then `up --deadline --resume`, or start over with "
        "`--replace` (it cancels that job)"
    )


def _old_state(state: ControlState) -> ControlState | None:
    """The run's last controller's state, in the bucket (None: no state there)."""
    from mncloud.control.state import load_uri

    return load_uri(state.config.state_uri) if state.config.state_uri else None


def _run_ids(old: ControlState | None) -> list[str]:
    """The run ids the run's last controllers launched or journaled (the old state's)."""
    if old is None:
        return []
    journaled = [old.launching.run_id] if old.launching and old.launching.run_id else []
    live = [old.live.run_id] if old.live is not None else []
    return list(dict.fromkeys([*old.earlier_run_ids, *old.run_ids, *live, *journaled]))


def _settled(
    host: ControllerHost,
    state: ControlState,
    old: ControlState | None,
    done: str = "",
) -> list[str]:
    """The old state's run ids, once no launch request naming one is in flight (waited for,
    `LAUNCH_WAIT_S` at most: SpecError after it), kept in the new state (`done`: what this
    `up` did already, for the refusal)."""
    run_ids = _run_ids(old)
    flying = host.settle_launches(run_ids, wait_s=LAUNCH_WAIT_S, poll_s=LAUNCH_POLL_S, sleep=pause)
    _refuse_in_flight(state.name, "a training launch of its last deadline controller", flying,
                      f"{done}nothing was launched", "up")  # fmt: skip
    state.earlier_run_ids = run_ids
    return run_ids


def live_jobs(host: ControllerHost, name: str, run_ids: list[str]) -> list[int]:
    """The ids of the live jobs of run `name` that carry one of `run_ids`."""
    from mncloud.constants import RUN_ID_ENV

    return [j.job_id for j in host.jobs_with_env(name, RUN_ID_ENV, run_ids) if j.live]


def _end_first(
    host: ControllerHost,
    state: ControlState,
    controllers: list[int],
) -> None:
    """`--replace`: cancel the live controller, then what its run launched (by run id, its
    launches in flight waited for first: the state read after the cancel, as it left it)."""
    host.cancel(controllers)
    done = f"controller job {', '.join(str(i) for i in controllers)} was cancelled, "
    run_ids = _settled(host, state, _old_state(state), done)
    host.cancel(live_jobs(host, state.name, run_ids))
