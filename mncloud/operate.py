"""A run's status as `mncloud status` shows it, whichever backend runs it: the backend's own
view, plus the newest complete checkpoint from the bucket, straggling ranks from the
telemetry the ranks publish and, for a `--deadline` run, its controller's view (mode,
progress in work-hours, slack, cost against all on-demand). A local deadline run whose
controller died is given a new one here (`control.revive`), which resumes from its state.

`stop_run` is `mncloud down`: the deadline controller first (it takes the run down), then
whatever of the run is left; on the local backend after a preemption notice, so every rank
saves the step it reached (`notice_s`; 0 stops at once)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.registry import backend_for_run
from mncloud.errors import MncloudError, RunNotFoundError

if TYPE_CHECKING:
    from mncloud.control.state import ControlState

#: How long `status` keeps trying a bucket before it reports it unreadable.
CKPT_LOOKUP_SECONDS = 5.0
#: A controller's phase → the run's state when no launch of it answers.
_PHASE_STATES = {
    "finished": RunState.SUCCEEDED,
    "failed": RunState.FAILED,
    "stopped": RunState.CANCELLED,
    "spot": RunState.RUNNING,
    "on-demand": RunState.RUNNING,
}


def newest_checkpoint_step(uri: str) -> int | None:
    """The newest complete, verified checkpoint step under `uri`, or None."""
    from mncloud.storage import CheckpointStore

    good, _skipped = CheckpointStore(uri, retry_seconds=CKPT_LOOKUP_SECONDS).candidates()
    return good[0] if good else None


def known_run_names() -> list[str]:
    """Every run `status` lists: launched ones, and deadline runs still waiting to launch."""
    from mncloud.backends.registry import known_runs
    from mncloud.control.state import controlled_runs

    names = known_runs()
    return names + [n for n in controlled_runs() if n not in names]


def run_status(run_name: str) -> RunStatus:
    """A run's status from its backend, with the newest checkpoint read from its bucket,
    the straggling ranks from its newest run record (none without a record) and, for a
    deadline run, its controller's view."""
    control = _control_state(run_name)
    revived = _revive(control)
    try:
        status = backend_for_run(run_name).status(run_name)
    except RunNotFoundError:
        if control is None:
            raise
        status = RunStatus(
            name=run_name,
            backend=control.config.backend,
            state=_PHASE_STATES.get(control.phase, RunState.PENDING),
            nodes=control.config.nodes,
            ckpt_uri=control.ckpt_uri,
        )
    if status.ckpt_uri and status.ckpt_step is None:
        try:
            status.ckpt_step = newest_checkpoint_step(status.ckpt_uri)
        except MncloudError as err:
            _prepend(status, f"checkpoints unreadable: {' '.join(str(err).split())[:120]}")
    _add_stragglers(status)
    if control is not None:
        _add_deadline(status, control)
    if revived:
        _prepend(status, f"its deadline controller had died: restarted (keeper pid {revived})")
    return status


def _revive(control: ControlState | None) -> int | None:
    """Restart a local deadline run's controller that died; its keeper's pid, or None."""
    if control is None or control.final or control.config.backend != "local":
        return None
    from mncloud.control.start import revive

    return revive(control.name)


def stop_run(run_name: str, notice_s: float = 0.0) -> RunStatus:
    """Stop a run (`mncloud down`) and return once nothing of it is left: its deadline
    controller (which takes the run down itself), then the run; a local run after a
    preemption notice of `notice_s` seconds to its nodes (none under node recovery, where the
    ranks do not watch for one: they are stopped at once)."""
    from mncloud.backends.local.backend import LocalBackend
    from mncloud.backends.registry import known_runs
    from mncloud.control.state import controlled_runs

    if run_name in controlled_runs():
        from mncloud.control.start import stop

        stop(run_name, notice_s)
    if run_name not in known_runs():
        return run_status(run_name)
    backend = backend_for_run(run_name)
    if isinstance(backend, LocalBackend):
        return backend.down(run_name, notice_s=notice_s)
    return backend.down(run_name)


def _control_state(run_name: str) -> ControlState | None:
    from mncloud.control.state import load_state

    try:
        return load_state(run_name)
    except MncloudError:
        return None


def _add_deadline(status: RunStatus, control: ControlState) -> None:
    """The controller's view; between launches the run is waiting, not over."""
    status.deadline = control.deadline_status()
    if control.final:
        status.state = _PHASE_STATES.get(control.phase, status.state)
        status.detail = control.detail or status.detail
    elif status.state.is_final:
        status.state = RunState.PENDING
        status.detail = f"{control.phase}: {status.deadline.reason}"


def _add_stragglers(status: RunStatus) -> None:
    from mncloud import records

    try:
        record = records.load_current(status.name)
    except MncloudError:
        return
    status.step_times = records.step_times(record, ckpt_uri=status.ckpt_uri)
    status.stragglers = records.straggler_ranks(status.step_times)
    note = records.straggler_note(status.step_times, status.stragglers)
    if note:
        _prepend(status, note)


def _prepend(status: RunStatus, note: str) -> None:
    status.detail = f"{note}; {status.detail}" if status.detail else note
