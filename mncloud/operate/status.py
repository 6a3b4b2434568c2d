"""A run's status as `mncloud status` shows it, whichever backend runs it: the backend's own
view, plus the newest complete checkpoint from the bucket (a `--ckpt-dir` run's folder there,
listed once: its newest committed unit, its files, what it keeps aside), straggling ranks
from the telemetry the ranks publish and, for a `--deadline` run, its controller's view
(mode, progress in work-hours, slack, cost against all on-demand). A deadline run whose
controller ran on this machine and died is given a new one here (`control.revive`), which
resumes from its state.

`all_statuses` is a bare `mncloud status`: a run whose files cannot be read (a torn
state.json, a launch that stopped before its run started, an unreadable controller state)
is one `UnreadableRun` row with the reason, never an error that hides the other runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from mncloud import layout
from mncloud.backends.base import Backend, RunState, RunStatus, first_unreadable
from mncloud.backends.registry import backend_for_run, get_backend
from mncloud.control.state import DeadlineStatus
from mncloud.errors import BackendError, MncloudError, RunNotFoundError

if TYPE_CHECKING:
    from mncloud.control.state import ControlState
    from mncloud.records.model import RunRecord
    from mncloud.storage.frameworkdirs import Newest

#: What `status` says of a bucket that did not answer (then nothing else reads it).
UNREADABLE = "checkpoints unreadable"
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
#: Errors of a run folder's own files (torn JSON, a schema they do not match, a lost file).
FILE_ERRORS = (OSError, ValueError, KeyError, TypeError)


class CkptDirView(BaseModel):
    """A `--ckpt-dir` run's folder in its bucket, as `status` shows it (one listing)."""

    newest: str | None = None
    """The newest committed unit by the step in its name (`folders.newest_committed`: the
    one the run's summary and `ckpt ls` name), shown in the ckpt column; None: none."""
    files: list[dict[str, Any]] = Field(default_factory=list)
    """Every file it holds: key (relative to the folder), size, mtime."""
    incomplete: list[dict[str, str]] = Field(default_factory=list)
    """Units kept aside (incomplete, or refused at a restore): name and reason."""


class RunView(RunStatus):
    """A run's status as `status` shows it: the backend's, with a deadline run's controller."""

    deadline: DeadlineStatus | None = None
    """A `--deadline` run's controller view (filled by `run_status`), else None."""
    ckpt_dir: CkptDirView | None = None
    """A `--ckpt-dir` run's folder in its bucket (filled by `run_status`), else None."""
    trackers: dict[str, str] = Field(default_factory=dict)
    """The link of each tracker run it logs into (`records.trackers.tracker_links`): "MLflow",
    "W&B"; only those known."""


class UnreadableRun(BaseModel):
    """A run `status` lists but cannot read: one row, with the reason."""

    name: str
    backend: str | None = None
    state: Literal["UNREADABLE"] = "UNREADABLE"
    detail: str


def newest_checkpoint_step(uri: str) -> int | None:
    """The newest complete, verified checkpoint step under `uri`, or None."""
    from mncloud.storage import CheckpointStore

    good, _skipped = CheckpointStore(uri, retry_seconds=CKPT_LOOKUP_SECONDS).candidates()
    return good[0] if good else None


def newest_ckpt_dir_entry(uri: str) -> Newest | None:
    """The newest checkpoint a framework wrote in the run's `--ckpt-dir` folder (its name and
    step: `storage.frameworkdirs`) among the units committed whole in the bucket (a torn
    folder is never named: `storage.folders`); None when there is none."""
    from mncloud.storage.folders import newest_committed, survey

    return newest_committed(survey(uri, CKPT_LOOKUP_SECONDS))


def ckpt_dir_view(uri: str) -> CkptDirView:
    """The run's `--ckpt-dir` folder in its bucket (`uri`: its checkpoint URI), listed once:
    its files, the units kept aside and the newest committed one."""
    from mncloud.storage.folders import inventory

    found = inventory(uri, CKPT_LOOKUP_SECONDS)
    newest = found.newest
    return CkptDirView(
        newest=newest.name if newest else None,
        files=[vars(f) for f in found.files],
        incomplete=[{"name": u.name, "reason": u.reason} for u in found.units if not u.committed],
    )


def known_run_names() -> list[str]:
    """Every run `status` lists: launched ones, and deadline runs still waiting to launch."""
    from mncloud.backends.registry import known_runs
    from mncloud.control.state import controlled_runs

    names = known_runs()
    return names + [n for n in controlled_runs() if n not in names]


def all_statuses() -> list[RunView | UnreadableRun]:
    """Every run `status` lists, oldest first; a run that cannot be read is an UnreadableRun
    (a run removed meanwhile is left out)."""
    found: list[RunView | UnreadableRun] = []
    for name in known_run_names():
        try:
            found.append(run_status(name))
        except (MncloudError, *FILE_ERRORS) as err:
            folder = layout.run_dir(name)
            if folder.is_dir():
                reason = _diagnose(folder) or " ".join(str(err).split())
                found.append(UnreadableRun(name=name, backend=_backend_word(folder), detail=reason))
    return found


def run_status(run_name: str) -> RunView:
    """A run's status from its backend, with the newest checkpoint read from its bucket,
    the straggling ranks from its newest run record (none without a record) and, for a
    deadline run, its controller's view. MncloudError when it cannot be read."""
    try:
        return _run_status(run_name)
    except (MncloudError, *FILE_ERRORS) as err:
        reason = _diagnose(layout.run_dir(run_name))
        if reason is None and isinstance(err, MncloudError):
            raise
        reason = reason or f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        raise BackendError(f"run {run_name!r} cannot be read: {reason}") from None


def _run_status(run_name: str) -> RunView:
    control, control_error = _control_state(run_name)
    revived = _revive(control)
    try:
        status = RunView(**dict(backend_for_run(run_name).status(run_name)))
    except RunNotFoundError:
        if control is None and control_error:
            raise MncloudError(control_error) from None
        if control is None:
            raise
        status = RunView(
            name=run_name,
            backend=control.config.backend,
            state=_PHASE_STATES.get(control.phase, RunState.PENDING),
            nodes=control.config.nodes,
            ckpt_uri=control.ckpt_uri,
        )
    record = _record(run_name)
    if status.ckpt_uri:
        try:
            if status.ckpt_step is None:
                status.ckpt_step = newest_checkpoint_step(status.ckpt_uri)
            if record is not None and record.spec.get("ckpt_dir"):
                _add_ckpt_dir(status, status.ckpt_uri)
        except MncloudError as err:
            prepend(status, f"{UNREADABLE}: {' '.join(str(err).split())[:120]}")
    _add_stragglers(status, record)
    if record is not None:
        from mncloud.records.trackers import tracker_links

        status.trackers = tracker_links(record)
    if control is not None:
        _add_deadline(status, control)
    if control_error:
        prepend(status, control_error)
    if revived:
        prepend(status, f"its deadline controller had died: restarted (keeper pid {revived})")
    return status


def _revive(control: ControlState | None) -> int | None:
    """Restart a deadline run's controller that ran here and died; its keeper's pid, or None."""
    if control is None or control.final or not get_backend(control.config.backend).runs_here:
        return None
    from mncloud.control.start import revive

    return revive(control.name)


def _control_state(run_name: str) -> tuple[ControlState | None, str | None]:
    """The run's controller state, or None with why when it has one that cannot be read."""
    from mncloud.control.state import load_state
    from mncloud.control.watch import checked

    try:
        return checked(load_state(run_name)), None
    except RunNotFoundError:
        return None, None
    except MncloudError as err:
        return None, str(err)


def _diagnose(folder: Path) -> str | None:
    """Which file of a run folder cannot be read, and why: the backend's own (`diagnose`),
    then the controller's state; None when all can."""
    from mncloud.control.state import ControlState

    if not folder.is_dir():
        return None
    backend = _backend_of(folder)
    if backend is not None:
        found = backend.diagnose(folder)
    else:
        found = first_unreadable(folder, sorted(folder.glob("*.json")), {})
    control = layout.control_state_file(folder.name)
    if found is None and control.is_file():
        found = first_unreadable(folder, [control], {control.name: ControlState})
    return found


def _backend_of(folder: Path) -> Backend | None:
    """The backend a run folder's backend.json names, if it names one there is."""
    word = _backend_word(folder)
    try:
        return get_backend(word) if word is not None else None
    except MncloudError:
        return None


def _backend_word(folder: Path) -> str | None:
    """The backend a run folder names, if its backend.json says."""
    from mncloud.backends.registry import BACKEND_FILE

    try:
        value = json.loads((folder / BACKEND_FILE).read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _add_deadline(status: RunView, control: ControlState) -> None:
    """The controller's view; between launches the run is waiting, not over."""
    status.deadline = control.deadline_status()
    if control.final:
        status.state = _PHASE_STATES.get(control.phase, status.state)
        status.detail = control.detail or status.detail
    elif status.state.is_final:
        status.state = RunState.PENDING
        status.detail = f"{control.phase}: {status.deadline.reason}"


def _record(run_name: str) -> RunRecord | None:
    """The run's newest record, or None without one."""
    from mncloud.records.store import load_current

    try:
        return load_current(run_name)
    except MncloudError:
        return None


def _add_ckpt_dir(status: RunView, uri: str) -> None:
    """A `--ckpt-dir` run's folder; its newest committed unit's step is the run's newest
    checkpoint when it has no CheckpointManager step (goodput then reads no bucket again)."""
    status.ckpt_dir = ckpt_dir_view(uri)
    if status.ckpt_step is None and status.ckpt_dir.newest is not None:
        from mncloud.storage.frameworkdirs import entry_step

        status.ckpt_step = entry_step(status.ckpt_dir.newest)


def _add_stragglers(status: RunStatus, record: RunRecord | None) -> None:
    from mncloud.telemetry.steps import step_times, straggler_note, straggler_ranks

    if record is None:
        return
    _add_bandwidth(status, record)
    status.step_times = step_times(record, ckpt_uri=status.ckpt_uri)
    status.stragglers = straggler_ranks(status.step_times)
    note = straggler_note(status.step_times, status.stragglers)
    if note:
        prepend(status, note)


def _add_bandwidth(status: RunStatus, record: RunRecord) -> None:
    """The preflight's bandwidth figure from beside the record, kept in the record once read."""
    from mncloud.doctor import bandwidth
    from mncloud.records.store import record_bandwidth

    found = record.bandwidth
    uri = record.ckpt_uri or status.ckpt_uri
    if found is None and uri and record.nodes > 1:
        try:
            found = bandwidth.read(uri, record.run_id)
        except (MncloudError, OSError, ValueError):
            found = None
        if found is not None:
            record_bandwidth(record.name, record.run_id, found)
    status.bandwidth = found


def prepend(status: RunStatus, note: str) -> None:
    """Put `note` before the status's detail."""
    status.detail = f"{note}; {status.detail}" if status.detail else note
