"""What the web view shows, gathered from what `status` and `runs` read (`mncloud.operate`,
`mncloud.records`, the run's checkpoint bucket): no second store, no web framework here.

A part that cannot be read (a malformed record, a bucket that does not answer) becomes an
error string on its page; only an unknown run is an error (`RunNotFoundError`, a 404).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, Field

from mncloud.errors import MncloudError, RunNotFoundError

if TYPE_CHECKING:
    from mncloud.operate import RunView, UnreadableRun
    from mncloud.records.model import RunRecord

#: Errors a run's own files or bucket may raise while a page is drawn.
READ_ERRORS = (MncloudError, OSError, ValueError, KeyError, TypeError)
LAUNCHES = ("launch", "recovery", "restart")
ENDS = ("preemption", "failure", "finish")
#: The most bytes of a diff a page shows.
DIFF_BYTES = 100_000


class Bar(BaseModel):
    """One launch of the run, from its event to the next launch or its end."""

    start: float
    end: float
    kind: str
    spot: bool | None = None
    detail: str = ""


class Mark(BaseModel):
    """A moment on the timeline: a preemption, a market switch, a failure."""

    time: float
    kind: str
    label: str


class Tick(BaseModel):
    """A checkpoint step, at its newest file's time."""

    time: float
    step: int
    complete: bool


class Timeline(BaseModel):
    """Everything the timeline SVG draws, in seconds since the epoch."""

    start: float
    end: float
    bars: list[Bar] = Field(default_factory=list)
    marks: list[Mark] = Field(default_factory=list)
    ticks: list[Tick] = Field(default_factory=list)
    deadline: float | None = None

    @property
    def start_label(self) -> str:
        return _when(self.start)

    @property
    def end_label(self) -> str:
        return f"{_when(self.end)} (+{_duration(self.end - self.start)})"


class Checkpoint(BaseModel):
    """A checkpoint step as `ckpt ls` lists it, with its quick (size-only) verification."""

    step: int
    complete: bool
    files: int
    size: int
    mtime: float
    verified: bool
    reason: str = ""


class RunRow(BaseModel):
    """One row of the runs table."""

    name: str
    state: str
    where: str = "-"
    nodes: str = "-"
    market: str = "-"
    restarts: str = "-"
    cost: str = "-"
    goodput: str = "-"
    slack: str = "-"
    detail: str = ""


def _when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def _market(spot: bool | None) -> str:
    return "-" if spot is None else "spot" if spot else "on-demand"


def run_rows() -> list[RunRow]:
    """The runs table: every run `status` lists, an unreadable one with its reason."""
    from mncloud.operate import all_statuses
    from mncloud.telemetry.series import reads_shared

    with reads_shared():
        return [_row(s, _goodput(s, _newest(s.name))) for s in all_statuses()]


def _newest(name: str) -> RunRecord | None:
    """A run's newest record (as `status_goodput` picks it; found through the record index,
    not every record parsed), or None."""
    from mncloud.records.store import load_current

    try:
        return load_current(name)
    except READ_ERRORS:
        return None


def _goodput(status: RunView | UnreadableRun, record: RunRecord | None) -> float | None:
    """`operate.status_goodput`, over a record already read."""
    from mncloud.operate import UnreadableRun, run_goodput

    if record is None or isinstance(status, UnreadableRun):
        return None
    try:
        found = status.ckpt_step is not None
        return run_goodput(record, status.ckpt_step, bucket=found).goodput
    except READ_ERRORS:
        return None


def _row(status: RunView | UnreadableRun, goodput: float | None) -> RunRow:
    from mncloud.operate import UnreadableRun

    if isinstance(status, UnreadableRun):
        return RunRow(name=status.name, state=status.state, detail=status.detail)
    where = "/".join(p for p in (status.cloud, status.region, status.instance_type) if p)
    slack = status.deadline.slack_hours if status.deadline else None
    return RunRow(
        name=status.name,
        state=status.state.value,
        where=where or status.backend,
        nodes=str(status.nodes),
        market=_market(status.spot),
        restarts=str(status.restarts),
        cost="-" if status.cost_so_far is None else f"${status.cost_so_far:,.2f}",
        goodput="-" if goodput is None else f"{goodput:.1%}",
        slack="-" if slack is None else f"{slack:.2f} h",
        detail=status.detail,
    )


def timeline(
    record: RunRecord | None,
    checkpoints: list[Checkpoint],
    *,
    running: bool,
    deadline: float | None = None,
    now: float | None = None,
) -> Timeline:
    """The launches of a record as bars, its preemptions and market switches as marks, the
    checkpoints as ticks; an open launch ends now while the run is going."""
    events = sorted(record.events, key=lambda e: e.time) if record else []
    bars: list[Bar] = []
    marks: list[Mark] = []
    open_bar: Bar | None = None
    for event in events:
        if (event.kind in LAUNCHES or event.kind in ENDS) and open_bar is not None:
            open_bar.end = event.time
            bars.append(open_bar)
            open_bar = None
        if event.kind in LAUNCHES:
            previous = bars[-1].spot if bars else None
            if bars and previous is not None and event.spot is not None and previous != event.spot:
                marks.append(Mark(time=event.time, kind="switch", label=f"→ {_market(event.spot)}"))
            open_bar = Bar(start=event.time, end=event.time, kind=event.kind, spot=event.spot,
                           detail=event.detail)  # fmt: skip
        elif event.kind in ("preemption", "node-lost"):
            node = "" if event.node is None else f" node {event.node}"
            marks.append(Mark(time=event.time, kind="preemption", label=f"preempted{node}"))
        elif event.kind == "failure":
            marks.append(Mark(time=event.time, kind="failure", label="failed"))
    times = [e.time for e in events] + [c.mtime for c in checkpoints]
    start = min(times, default=record.created_at if record else time.time())
    end = max(times, default=start)
    if running:
        end = max(end, now or time.time())
    if open_bar is not None:
        open_bar.end = end
        bars.append(open_bar)
    if deadline is not None:
        end = max(end, deadline)
    ticks = [Tick(time=c.mtime, step=c.step, complete=c.complete) for c in checkpoints]
    return Timeline(start=start, end=end, bars=bars, marks=marks, ticks=ticks, deadline=deadline)


def checkpoints(uri: str | None) -> tuple[list[Checkpoint], str | None]:
    """The run's checkpoint steps with their quick verification, or the error reading them."""
    if uri is None:
        return [], None
    from mncloud.operate import CKPT_LOOKUP_SECONDS
    from mncloud.storage import CheckpointStore

    try:
        store = CheckpointStore(uri, retry_seconds=CKPT_LOOKUP_SECONDS)
        verdicts = {v.step: v for v in store.verify_all()}
        found = []
        for info in store.steps():
            verdict = verdicts.get(info.step)
            ok = bool(verdict and verdict.ok)
            reason = verdict.reason if verdict else "listed after verification"
            found.append(
                Checkpoint(step=info.step, complete=info.complete, files=info.n_files,
                           size=info.size, mtime=info.mtime, verified=ok, reason=reason)
            )  # fmt: skip
        return found, None
    except READ_ERRORS as err:
        return [], f"checkpoints at {uri} cannot be read: {err}"


def deadline_at(name: str) -> float | None:
    """A deadline run's deadline (wall time), from its controller state; None otherwise."""
    from mncloud.control.state import load_state

    try:
        state = load_state(name)
    except READ_ERRORS:
        return None
    if state.started_at is None:
        return None
    return state.started_at + state.held_s + state.config.deadline_s / state.config.time_scale


def record_sections(record: RunRecord) -> dict[str, str]:
    """The run record as text blocks: lineage, spec, launch options, plan, diff (the record
    is redacted when written: shown as stored)."""
    git = record.git
    lineage = {
        "run_id": record.run_id,
        "created": _when(record.created_at),
        "user": record.user,
        "host": record.host,
        "mncloud": record.mncloud_version,
        "commit": git.commit if git else None,
        "branch": git.branch if git else None,
        "dirty": bool(git and git.diff_sha256),
    }
    sections = {
        "lineage": _yaml(lineage),
        "spec": _yaml(record.spec),
        "launch options": _yaml(record.launch_options),
    }
    if record.plan is not None:
        sections["plan"] = json.dumps(record.plan, indent=2, default=str)
    if git and git.diff_sha256:
        from mncloud.records.store import load_diff

        try:
            diff = load_diff(record)
            sections["diff"] = diff[:DIFF_BYTES].decode("utf-8", "replace")
        except READ_ERRORS as err:
            sections["diff"] = f"(cannot be read: {err})"
    return sections


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def known(name: str) -> bool:
    """Whether `status` lists the run or a record of it exists here."""
    from mncloud.operate import known_run_names

    try:
        return name in known_run_names() or _newest(name) is not None
    except READ_ERRORS:
        return False


def log_lines(name: str, node: int | None, tail: int) -> list[str]:
    """The last `tail` lines of the run's log (one node's with `node`)."""
    from mncloud.operate import run_logs

    if not known(name):
        raise RunNotFoundError(f"no run named {name!r}")
    return list(run_logs(name, node, tail=tail))


def _metrics(record: Any, uri: str | None, errors: list[str]) -> Any:
    """The run's telemetry curves (`telemetry.curves`) with the previous run of its lineage (the
    same name's record before it) for comparison, or None without telemetry."""
    from mncloud.operate import run_series
    from mncloud.records.store import load_current
    from mncloud.telemetry.curves import metrics_view

    if record is None:
        return None
    try:
        series = run_series(record, uri)
        try:
            earlier = load_current(record.name, before=record.created_at)
        except RunNotFoundError:
            earlier = None
        before = run_series(earlier) if earlier is not None else None
    except READ_ERRORS as err:
        errors.append(f"telemetry: {err}")
        return None
    if series is None:
        return None
    view = metrics_view(record.run_id, series)
    if earlier is not None and before is not None and before.steps:
        view.previous = metrics_view(earlier.run_id, before)
    return view


def run_page(name: str) -> dict[str, Any]:
    """Everything a run's page shows; each part that cannot be read becomes an error line.
    RunNotFoundError for a run neither `status` nor the records know. Its telemetry is read
    once (`telemetry.series.reads_shared`)."""
    from mncloud.telemetry.series import reads_shared

    with reads_shared():
        return _run_page(name)


def _run_page(name: str) -> dict[str, Any]:
    from mncloud.operate import run_goodput, run_status
    from mncloud.records.store import load_current

    if not known(name):
        raise RunNotFoundError(f"no run named {name!r}")
    errors: list[str] = []
    status = record = ledger = None
    try:
        status = run_status(name)
    except READ_ERRORS as err:
        errors.append(str(err))
    try:
        record = load_current(name)
    except READ_ERRORS as err:
        errors.append(f"run record: {err}")
    uri = (status.ckpt_uri if status else None) or (record.ckpt_uri if record else None)
    ckpts, ckpt_error = checkpoints(uri)
    errors += [ckpt_error] if ckpt_error else []
    if record is not None:
        try:
            step = status.ckpt_step if status else None
            ledger = run_goodput(record, step, bucket=uri is not None)
        except READ_ERRORS as err:
            errors.append(f"goodput: {err}")
    running = status is not None and not status.state.is_final
    return {
        "metrics": _metrics(record, uri, errors),
        "name": name,
        "status": status,
        "row": _row(status, ledger.goodput if ledger else None) if status else None,
        "record": record,
        "ledger": ledger,
        "checkpoints": ckpts,
        "timeline": timeline(record, ckpts, running=running, deadline=deadline_at(name)),
        "sections": record_sections(record) if record else {},
        "nodes": list(range(status.nodes)) if status else [],
        "running": running,
        "errors": errors,
        "when": _when,
    }
