"""A run's status as `mncloud status` shows it, whichever backend runs it: the backend's own
view, plus the newest complete checkpoint from the bucket, straggling ranks from the
telemetry the ranks publish and, for a `--deadline` run, its controller's view (mode,
progress in work-hours, slack, cost against all on-demand). A local deadline run whose
controller died is given a new one here (`control.revive`), which resumes from its state.

`stop_run` is `mncloud down`: the deadline controller first (it takes the run down), then
whatever of the run is left; on the local backend after a preemption notice, so every rank
saves the step it reached (`notice_s`; 0 stops at once).

`all_statuses` is a bare `mncloud status`: a run whose files cannot be read (a torn
state.json, a launch that stopped before its run started, an unreadable controller state)
is one `UnreadableRun` row with the reason, never an error that hides the other runs."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from mncloud import layout
from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.registry import backend_for_run
from mncloud.errors import BackendError, MncloudError, RunNotFoundError, first_error
from mncloud.records.model import OPENS_SEGMENT, Event

if TYPE_CHECKING:
    from mncloud.control.state import ControlState
    from mncloud.records.curves import MetricsView
    from mncloud.records.goodput import GoodputLedger, StepMark, Telemetry
    from mncloud.records.model import RunRecord
    from mncloud.records.series import Series

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


class UnreadableRun(BaseModel):
    """A run `status` lists but cannot read: one row, with the reason."""

    name: str
    backend: str | None = None
    state: Literal["UNREADABLE"] = "UNREADABLE"
    detail: str


#: Errors of a run folder's own files (torn JSON, a schema they do not match, a lost file).
_FILE_ERRORS = (OSError, ValueError, KeyError, TypeError)
#: An event's placement and price, copied onto a relaunch read off the telemetry.
_PLACEMENT = {"cloud", "region", "instance_type", "spot", "hourly_price"}


def all_statuses() -> list[RunStatus | UnreadableRun]:
    """Every run `status` lists, oldest first; a run that cannot be read is an UnreadableRun
    (a run removed meanwhile is left out)."""
    found: list[RunStatus | UnreadableRun] = []
    for name in known_run_names():
        try:
            found.append(run_status(name))
        except (MncloudError, *_FILE_ERRORS) as err:
            folder = layout.run_dir(name)
            if folder.is_dir():
                reason = _diagnose(folder) or " ".join(str(err).split())
                found.append(UnreadableRun(name=name, backend=_backend_word(folder), detail=reason))
    return found


def run_status(run_name: str) -> RunStatus:
    """A run's status from its backend, with the newest checkpoint read from its bucket,
    the straggling ranks from its newest run record (none without a record) and, for a
    deadline run, its controller's view. MncloudError when it cannot be read."""
    try:
        return _run_status(run_name)
    except (MncloudError, *_FILE_ERRORS) as err:
        reason = _diagnose(layout.run_dir(run_name))
        if reason is None and isinstance(err, MncloudError):
            raise
        reason = reason or f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        raise BackendError(f"run {run_name!r} cannot be read: {reason}") from None


def _run_status(run_name: str) -> RunStatus:
    control, control_error = _control_state(run_name)
    revived = _revive(control)
    try:
        status = backend_for_run(run_name).status(run_name)
    except RunNotFoundError:
        if control is None and control_error:
            raise MncloudError(control_error) from None
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
            _prepend(status, f"{UNREADABLE}: {' '.join(str(err).split())[:120]}")
    _add_stragglers(status)
    if control is not None:
        _add_deadline(status, control)
    if control_error:
        _prepend(status, control_error)
    if revived:
        _prepend(status, f"its deadline controller had died: restarted (keeper pid {revived})")
    return status


def run_logs(
    run_name: str,
    node: int | None = None,
    *,
    follow: bool = False,
    tail: int | None = None,
    since: float | None = None,
) -> Iterator[str]:
    """`mncloud logs`: the run's lines from every node (or `node`'s); with `since` (a time),
    only those written since then (local runs: to the second); with `tail`, only the last
    `tail` of those, then, with `follow`, the new ones as they come."""
    from mncloud.backends.local.backend import LocalBackend

    backend = backend_for_run(run_name)
    if since is not None and not isinstance(backend, LocalBackend):
        raise BackendError(f"--since: {backend.name} logs carry no times; use --tail N")

    def lines(follow_now: bool) -> Iterator[str]:
        if isinstance(backend, LocalBackend) and since is not None:
            return backend.logs(run_name, node=node, follow=follow_now, since=since)
        return backend.logs(run_name, node=node, follow=follow_now)

    if tail is None:
        yield from lines(follow)
        return
    last: collections.deque[str] = collections.deque(maxlen=tail)
    seen = 0
    for line in lines(False):
        last.append(line)
        seen += 1
    yield from last
    if follow:  # the same lines again, then the new ones: skip those already counted
        for index, line in enumerate(lines(True)):
            if index >= seen:
                yield line


def _revive(control: ControlState | None) -> int | None:
    """Restart a local deadline run's controller that died; its keeper's pid, or None."""
    if control is None or control.final or control.config.backend != "local":
        return None
    from mncloud.control.start import revive

    return revive(control.name)


def stop_run(run_name: str, notice_s: float = 0.0) -> RunStatus:
    """Stop a run (`mncloud down`) and return once nothing of it is left: its deadline
    controller (which takes the run down itself), then the run, after a preemption notice of
    `notice_s` seconds to its nodes (none under node recovery, where the ranks do not watch
    for one: they are stopped at once). A cloud run's notice goes through its bucket. A run
    this machine holds no record of: a cloud deadline run's training jobs (its controller's VM
    launched them) were cancelled by id from the controller's state (`control/down.py`); a run
    launched elsewhere: its live SkyPilot jobs of that name, by id."""
    from mncloud.backends.registry import known_runs
    from mncloud.control.state import controlled_runs

    controlled = run_name in controlled_runs()
    said = None
    if controlled:
        from mncloud.control.start import stop

        said = stop(run_name, notice_s)
    if run_name not in known_runs():
        if not controlled:  # a cloud deadline run started elsewhere: SkyPilot names it
            from mncloud.control.down import stop_elsewhere

            said = stop_elsewhere(run_name, notice_s)
            controlled = said is not None
        return _stop_unrecorded(run_name, controlled, said)
    status = backend_for_run(run_name).down(run_name, notice_s=notice_s)
    if said and status.backend != "local":  # what the cloud controller's `stop` cancelled
        _prepend(status, said)
    return status


def _stop_unrecorded(run_name: str, controlled: bool, said: str | None) -> RunStatus:
    """`down` of a run with no backend record here (see `stop_run`); `said`: what stopping
    its deadline controller did."""
    from mncloud.backends.skypilot.backend import down_unrecorded

    if controlled:  # `stop` took it all down (a cloud run's jobs by id, never by name)
        status = run_status(run_name)
        if said:
            _prepend(status, said)
        return status
    try:
        return down_unrecorded(run_name)
    except RunNotFoundError:
        raise
    except MncloudError as err:
        raise BackendError(f"mncloud has no record of a run {run_name!r}, and {err}") from None


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
    """Which file of a run folder cannot be read, and why; None when all can."""
    from mncloud.backends.local.state import LAUNCH_FILE, STATE_FILE, LocalLaunch, LocalState
    from mncloud.control.state import ControlState

    if not folder.is_dir():
        return None
    models = {STATE_FILE: LocalState, LAUNCH_FILE: LocalLaunch}
    control = layout.control_state_file(folder.name)
    for path in [*sorted(folder.glob("*.json")), *([control] if control.is_file() else [])]:
        model = ControlState if path == control else models.get(path.name)
        try:
            data = path.read_bytes()
            model.model_validate_json(data) if model else json.loads(data)
        except (OSError, ValueError) as err:
            where = path.relative_to(folder)
            if hasattr(err, "errors"):
                return f"{first_error(err, str(where))} (in {folder})"
            return f"{where}: {type(err).__name__} (in {folder})"
    if _backend_word(folder) == "local" and not (folder / STATE_FILE).is_file():
        return f"{STATE_FILE} is missing: its launch stopped before the run started ({folder})"
    return None


def _backend_word(folder: Path) -> str | None:
    """The backend a run folder names, if its backend.json says."""
    from mncloud.backends.registry import BACKEND_FILE

    try:
        value = json.loads((folder / BACKEND_FILE).read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


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
    _add_bandwidth(status, record)
    status.step_times = records.step_times(record, ckpt_uri=status.ckpt_uri)
    status.stragglers = records.straggler_ranks(status.step_times)
    note = records.straggler_note(status.step_times, status.stragglers)
    if note:
        _prepend(status, note)


def _add_bandwidth(status: RunStatus, record: RunRecord) -> None:
    """The preflight's bandwidth figure from beside the record, kept in the record once read."""
    from mncloud import records
    from mncloud.doctor import bandwidth

    found = record.bandwidth
    uri = record.ckpt_uri or status.ckpt_uri
    if found is None and uri and record.nodes > 1:
        try:
            found = bandwidth.read(uri, record.run_id)
        except (MncloudError, OSError, ValueError):
            found = None
        if found is not None:
            records.record_bandwidth(record.name, record.run_id, found)
    status.bandwidth = found


def _prepend(status: RunStatus, note: str) -> None:
    status.detail = f"{note}; {status.detail}" if status.detail else note


def run_telemetry(
    record: RunRecord,
    ckpt_step: int | None = None,
    *,
    bucket: bool = True,
    series: Series | None = None,
) -> Telemetry:
    """What `records.goodput` needs beyond the record: the steps from the run's telemetry
    segments (`series`, or read here; every backend), the newest complete checkpoint
    (`ckpt_step` when the caller read it already) and the final step. `bucket=False` reads no
    bucket but a local run's `file://` one (while its folder holds this run)."""
    from mncloud.backends.local.state import load_state
    from mncloud.records.goodput import Telemetry

    folder = layout.run_dir(record.name)
    steps: list[StepMark] | None = None
    uri = record.ckpt_uri
    if record.backend == "local" and _local_run_id(folder) == record.run_id:
        steps = _legacy_step_marks(folder)
        try:
            uri = uri or load_state(folder).ckpt_uri
        except (MncloudError, *_FILE_ERRORS):
            pass
    on_disk = steps is not None and uri is not None and uri.startswith("file://")
    if series is None and uri is not None and (bucket or on_disk):
        series = run_series(record, uri)
    if series is not None and series.steps:
        steps = _series_marks(series)
    newest, final = ckpt_step, None
    if uri is not None and bucket:
        from mncloud.backends.local.figures import read_final

        try:
            newest = newest_checkpoint_step(uri) if newest is None else newest
            final = (read_final(uri) or {}).get("steps")
        except (MncloudError, OSError, ValueError):
            pass
    checkpoints = None if newest is None else [newest]
    return Telemetry(steps=steps, checkpoints=checkpoints, final_step=final)


def run_goodput(
    record: RunRecord, ckpt_step: int | None = None, *, bucket: bool = True
) -> GoodputLedger:
    """A run record's goodput ledger (`records/goodput.py`) over its telemetry; a cloud run's
    relaunches that its record does not hold are read off its telemetry (`with_relaunches`)."""
    from mncloud.records.goodput import goodput_ledger

    series = run_series(record) if bucket else None
    if series is not None and record.backend != "local":
        record = with_relaunches(record, series)
    telemetry = run_telemetry(record, ckpt_step, bucket=bucket, series=series)
    return goodput_ledger(record, telemetry)


def with_relaunches(record: RunRecord, series: Series) -> RunRecord:
    """The record with a `recovery` event at each relaunch its telemetry shows and its events
    do not: SkyPilot recovers a managed job by itself, so a cloud record holds only the first
    launch. New processes of the gang mark a relaunch; the recovery opens at the last step
    any rank finished before it started, so the billed total stays the record's and the time
    between (the step in flight, provisioning, start-up) counts as recovery. Example: launch
    at t=0, steps 1..14 until t=45 (process A), steps 11..30 from t=80 (process B) → a
    recovery at t=45."""
    opens = sorted((e for e in record.events if e.kind in OPENS_SEGMENT), key=lambda e: e.time)
    if not opens:
        return record
    added = []
    for prev, nxt in itertools.pairwise(series.launches()):
        if any(prev.last_t < e.time <= nxt.first_t for e in opens):
            continue  # the record saw this relaunch
        price = max((e for e in opens if e.time <= prev.last_t), key=lambda e: e.time, default=None)
        fields = price.model_dump(include=_PLACEMENT) if price is not None else {}
        cut = max((r.t for r in series.steps if r.t < nxt.t0), default=prev.last_t)
        detail = "relaunch seen in telemetry"
        added.append(Event(kind="recovery", time=cut + 1e-6, detail=detail, **fields))
    if not added:
        return record
    return record.model_copy(update={"events": [*record.events, *added]})


def run_series(record: RunRecord, ckpt_uri: str | None = None) -> Series | None:
    """A run's telemetry segments, merged and compacted in the bucket (`records.series`),
    under its checkpoint URI or
    `ckpt_uri`; None when neither is known or the bucket cannot be read."""
    from mncloud.records.series import read_series

    uri = record.ckpt_uri or ckpt_uri
    if uri is None and record.backend == "local":
        uri = _local_ckpt_uri(record)
    if uri is None:
        return None
    try:
        return read_series(layout.series_uri(uri, record.run_id), compact=True)
    except (MncloudError, OSError, ValueError):
        return None


def _local_ckpt_uri(record: RunRecord) -> str | None:
    from mncloud.backends.local.state import load_state

    folder = layout.run_dir(record.name)
    if _local_run_id(folder) != record.run_id:
        return None
    try:
        return load_state(folder).ckpt_uri
    except (MncloudError, *_FILE_ERRORS):
        return None


def _series_marks(series: Series) -> list[StepMark]:
    from mncloud.records.goodput import StepMark

    return [StepMark(t=r.t, step=r.step, ckpt_s=r.ckpt_s) for r in series.steps]


def _legacy_step_marks(folder: Path) -> list[StepMark]:
    """A local run's steps from before the telemetry segments (rank 0's `progress.jsonl`)."""
    from pydantic import ValidationError

    from mncloud.backends.local.state import read_jsonl
    from mncloud.records.goodput import StepMark

    marks = []
    for line in read_jsonl(folder / "progress.jsonl"):
        if isinstance(line, dict) and "step" in line and "event" not in line:
            with contextlib.suppress(ValidationError):
                marks.append(StepMark.model_validate(line))
    return marks


def _local_run_id(folder: Path) -> str | None:
    from mncloud.backends.local.state import load_launch

    try:
        return load_launch(folder).run_id
    except (OSError, ValueError):
        return None


def status_goodput(status: RunStatus) -> float | None:
    """The goodput `status` shows for a run: of its newest record, over its telemetry; None
    without a record or per-step telemetry, or when they cannot be read. The bucket is read
    again only where `run_status` read it (it answered: a checkpoint found, or none there)."""
    from mncloud import records

    try:
        record = records.load_current(status.name)
        answered = status.ckpt_step is not None or (
            status.ckpt_uri is not None and UNREADABLE not in status.detail
        )
        return run_goodput(record, status.ckpt_step, bucket=answered).goodput
    except (MncloudError, *_FILE_ERRORS):
        return None


def run_metrics(run_name: str) -> MetricsView:
    """The curves of a run's newest record (`records.curves`): its reported metrics over
    steps, step time per node, its launches. Raises when the run or its bucket is unknown."""
    from mncloud import records
    from mncloud.records.curves import metrics_view

    record = records.load_current(run_name)
    series = run_series(record)
    if series is None:
        raise MncloudError(
            f"run {run_name!r} has no readable telemetry: it needs a bucket (--bucket) or a "
            f"local checkpoint folder, and the bucket must be reachable"
        )
    return metrics_view(record.run_id, series)
