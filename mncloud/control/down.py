"""`mncloud down` of a cloud deadline run: its controller's job and every training job, by id.

The laptop seldom knows the training jobs: the controller launched them from its own VM, where
their `skypilot.json` and `backend.json` are. Their ids are in the controller's state, mirrored
to the bucket; a launch journaled but not yet recorded is looked for in SkyPilot's queue by its
run id (the backend's `ControllerHost`). Nothing is cancelled by name. In this order:

    1. the controller's job(s) (its id in the state, and any job of `<name>-control` whose
       envs name this run's state) cancelled, and waited for until terminal: from then on
       nothing launches, and a launch it had under way is journaled in the state
    2. the state read again from the bucket: the job ids of every launch, and the jobs of a
       journaled launch found by its run id
    3. a running training job gets the preemption notice through the bucket (its ranks save
       the step they reached); every live one is cancelled by id, and waited for until
       SkyPilot reports it terminal
    4. every launch's record still open closed at SkyPilot's end time, from the bucket's copy
       where this machine lacks it (a laptop; `billing.close_downed`), the cost kept in the state
    5. the state marked stopped, here and in the bucket; what was cancelled said in one line

A second `down` finds nothing live and says so. A job still live after the wait, or a SkyPilot
API server that stops answering half way, is an error that names what is still live.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mncloud.errors import BackendError, CancelError, MncloudError

if TYPE_CHECKING:
    from mncloud.backends.base import ControllerHost
    from mncloud.control.state import ControlState


def host_of(state: ControlState) -> ControllerHost:
    """The controller host of the run's backend (a cloud run: SkyPilot's managed jobs)."""
    from mncloud.backends.registry import get_backend

    return get_backend(state.config.backend).controller_host()


def stop_cloud(
    state: ControlState,
    notice_s: float,
    *,
    wait_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Stop a cloud deadline run (see the module docstring); what was done, in one line."""
    from mncloud.control.billing import close_downed

    host = host_of(state)
    wait = {"wait_s": wait_s, "sleep": sleep}
    name, done = state.name, []
    try:
        controllers = host.cancel(_controller_ids(host, state), **wait)
    except MncloudError as err:
        raise BackendError(f"{err}; no training job of {name} was cancelled") from None
    if controllers:
        done.append(f"controller job {_ids(controllers)}")
    fresh, training = state, None  # type: ControlState, list[int] | None
    try:
        fresh = _fresh(state)
        training = _training_ids(host, fresh)
        noticed = _notice(host, fresh, training, notice_s)
        cancelled = host.cancel(training, **wait)
    except MncloudError as err:
        gone = f"; {' and '.join(done)} cancelled" if done else ""
        if isinstance(err, CancelError):  # it names the jobs that may still be live
            raise BackendError(f"{err}{gone}") from None
        known = f"training job(s) {_ids(training)}" if training else "its training jobs"
        raise BackendError(f"{err}{gone}; {known} may still be live (`sky jobs queue`)") from None
    finally:
        if fresh.ckpt_uri:
            host.withdraw_notice(fresh.ckpt_uri)
    if cancelled:
        done.append(f"training job {_ids(cancelled)}{noticed}")
    close_downed(fresh)  # no controller looks again: the record ends at SkyPilot's end
    _mark_stopped(fresh)
    if not done:
        return "nothing of the run was live"
    return f"cancelled {' and '.join(done)}; all terminal"


def stop_elsewhere(name: str, notice_s: float) -> str | None:
    """`down NAME` on a machine with no controller state of it (another laptop, a wiped
    home): SkyPilot's queue names the run's controller jobs (`NAME-control`, any user), their
    envs the state in the bucket; each such run stopped as above (`stop_cloud`), its state
    then kept here. None when SkyPilot knows no controller of that name."""
    from mncloud.backends.registry import backend_names, get_backend
    from mncloud.control.state import load_uri

    said = []
    for backend in map(get_backend, backend_names()):
        if backend.runs_here:  # its controller is a process here: this machine would know it
            continue
        host = backend.controller_host()
        if not host.may_ask():  # a local API server not running: not started for a guess
            continue
        try:
            uris = host.controller_state_uris(name)
        except MncloudError as err:
            raise BackendError(f"mncloud has no record of a run {name!r}, and {err}") from None
        for uri in uris:
            state = load_uri(uri)
            if state is None:
                raise BackendError(
                    f"{name}-control keeps its state at {uri}, which cannot be read from here; "
                    "nothing was cancelled (check the bucket's credentials, then `down` again)"
                )
            said.append(stop_cloud(state, notice_s))
    return "; ".join(said) if said else None


def _ids(job_ids: list[int]) -> str:
    return ", ".join(str(i) for i in sorted(job_ids))


def _controller_ids(host: ControllerHost, state: ControlState) -> list[int]:
    """The controller's job: its id in the state, and every job of its name for this run."""
    from mncloud.constants import CONTROL_STATE_URI_ENV

    ids = {state.controller_job_id} - {None}
    uri = state.config.state_uri
    if uri:
        jobs = host.jobs_with_env(f"{state.name}-control", CONTROL_STATE_URI_ENV, [uri])
        ids |= {job.job_id for job in jobs}
    return sorted(i for i in ids if i is not None)


def _fresh(state: ControlState) -> ControlState:
    """The state as the controller left it in the bucket; BackendError when it cannot be
    read there (this machine's copy, from `up`, names no training job)."""
    from mncloud.control.state import load_uri

    uri = state.config.state_uri
    remote = load_uri(uri) if uri else None
    if remote is None:
        raise BackendError(f"the deadline controller's state at {uri} cannot be read")
    return remote if remote.updated_at >= state.updated_at else state


def _training_ids(host: ControllerHost, st: ControlState) -> list[int]:
    """Every training job id of the run: the state's, and the jobs its launches' run ids name
    (a journaled launch's request waited for first)."""
    from mncloud.constants import RUN_ID_ENV

    ids = set(st.job_ids) | set(st.live.job_ids if st.live is not None else [])
    run_ids = set(st.run_ids) | ({st.live.run_id} if st.live is not None else set())
    run_ids |= set(st.earlier_run_ids)  # a launch of a controller before (`lease.py`)
    if st.launching is not None and st.launching.run_id:
        host.wait_for_launch_requests(st.launching.run_id)
        run_ids.add(st.launching.run_id)
    ids |= {job.job_id for job in host.jobs_with_env(st.name, RUN_ID_ENV, run_ids)}
    return sorted(ids)


def _notice(host: ControllerHost, st: ControlState, job_ids: list[int], notice_s: float) -> str:
    """The preemption notice to a running training job, through the bucket; what it saved."""
    from mncloud.backends.base import RunState

    def state_of() -> RunState:
        running = any("RUNNING" in job.statuses for job in host.job_states(job_ids).values())
        return RunState.RUNNING if running else RunState.CANCELLED

    if notice_s <= 0 or not job_ids or not st.ckpt_uri or state_of() is not RunState.RUNNING:
        return ""
    saved = host.give_notice(st.ckpt_uri, notice_s, state_of, "mncloud down")
    return f" after a {notice_s:g}s notice ({f'step {saved} saved' if saved else 'no new step'})"


def _mark_stopped(st: ControlState) -> None:
    from mncloud.control.state import save_state
    from mncloud.deadline.policy import Mode

    if not st.final:
        st.phase, st.market, st.mode = "stopped", Mode.NONE, Mode.NONE
        st.detail = "stopped by mncloud down"
        st.closing = st.launching = None
    save_state(st)
