"""A run's status as `mncloud status` shows it, whichever backend runs it: the backend's own
view, plus the newest complete checkpoint from the bucket, straggling ranks from the
telemetry the ranks publish and, for a `--deadline` run, its controller's view (mode,
progress in work-hours, slack, cost against all on-demand)."""

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
    return status


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
