"""What a run did, read off its telemetry: the steps its ranks published (the telemetry
segments in its bucket, read through each process's rollup: `telemetry.series.read_summary`,
in a time that does not grow with the run's length), its goodput ledger (`records.goodput`),
its metrics' curves (`telemetry.curves`; every record with `raw`), and the relaunches a
backend made by itself that its record does not hold. Where a backend keeps more than the
record says (a local run's default checkpoint folder, its steps from before the segments), it
answers through `Backend`."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from mncloud import layout
from mncloud.backends.base import Backend, RunStatus
from mncloud.backends.registry import get_backend
from mncloud.errors import MncloudError
from mncloud.operate.status import (
    FILE_ERRORS,
    UNREADABLE,
    newest_checkpoint_step,
    newest_ckpt_dir_entry,
)
from mncloud.records.model import OPENS_SEGMENT, Event

if TYPE_CHECKING:
    from mncloud.records.goodput import GoodputLedger, Telemetry
    from mncloud.records.model import RunRecord
    from mncloud.telemetry.curves import MetricsView
    from mncloud.telemetry.series import Series

#: An event's placement and price, copied onto a relaunch read off the telemetry.
_PLACEMENT = {"cloud", "region", "instance_type", "spot", "hourly_price"}


def _backend(record: RunRecord) -> Backend | None:
    """The backend that ran the record's run, if it is one there is."""
    try:
        return get_backend(record.backend)
    except MncloudError:
        return None


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
    from mncloud.records.goodput import Telemetry
    from mncloud.storage.final import read_final

    backend = _backend(record)
    uri = record.ckpt_uri
    steps = backend.legacy_steps(record.name, record.run_id) if backend else None
    if steps is not None and backend is not None:  # the backend holds this launch's files
        uri = uri or backend.ckpt_uri_of(record.name, record.run_id)
    on_disk = steps is not None and uri is not None and uri.startswith("file://")
    if series is None and uri is not None and (bucket or on_disk):
        series = run_series(record, uri, metrics=False)
    if series is not None and series.steps:
        from mncloud.records.goodput import series_marks

        steps = series_marks(series)
    steps = steps or None  # a script that reports no steps: the split is unknown, not 0 %
    newest, final = ckpt_step, None
    if uri is not None and bucket:
        try:
            newest = newest_checkpoint_step(uri) if newest is None else newest
            if newest is None and record.spec.get("ckpt_dir"):  # a framework's own folders
                entry = newest_ckpt_dir_entry(uri)
                newest = entry.step if entry else None
            final = (read_final(uri) or {}).get("steps")
        except (MncloudError, OSError, ValueError):
            pass
    checkpoints = None if newest is None else [newest]
    return Telemetry(steps=steps, checkpoints=checkpoints, final_step=final)


def run_goodput(
    record: RunRecord, ckpt_step: int | None = None, *, bucket: bool = True
) -> GoodputLedger:
    """A run record's goodput ledger (`records/goodput.py`) over its telemetry; relaunches
    its backend made without recording them are read off its telemetry (`with_relaunches`)."""
    from mncloud.records.goodput import goodput_ledger

    series = run_series(record, metrics=False) if bucket else None
    backend = _backend(record)
    if series is not None and not (backend is not None and backend.records_own_events):
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


def run_series(
    record: RunRecord, ckpt_uri: str | None = None, *, raw: bool = False, metrics: bool = True
) -> Series | None:
    """A run's telemetry (`telemetry.series`) under its checkpoint URI, `ckpt_uri` or where
    its backend keeps this launch's checkpoints: through its rollups (`read_summary`; its
    metric points only with `metrics`), or with `raw` every segment; None when none is known
    or the bucket cannot be read."""
    from mncloud.telemetry.series import read_series, read_summary

    uri = record.ckpt_uri or ckpt_uri
    backend = _backend(record) if uri is None else None
    if backend is not None:
        uri = backend.ckpt_uri_of(record.name, record.run_id)
    if uri is None:
        return None
    series_uri = layout.series_uri(uri, record.run_id)
    try:
        return read_series(series_uri) if raw else read_summary(series_uri, metrics=metrics)
    except (MncloudError, OSError, ValueError):
        return None


def status_goodput(status: RunStatus) -> float | None:
    """The goodput `status` shows for a run: of its newest record, over its telemetry; None
    without a record or per-step telemetry, or when they cannot be read. The bucket is read
    again only where `run_status` read it (it answered: a checkpoint found, or none there)."""
    from mncloud.records.store import load_current

    try:
        record = load_current(status.name)
        answered = status.ckpt_step is not None or (
            status.ckpt_uri is not None and UNREADABLE not in status.detail
        )
        return run_goodput(record, status.ckpt_step, bucket=answered).goodput
    except (MncloudError, *FILE_ERRORS):
        return None


def run_metrics(run_name: str, *, raw: bool = False) -> MetricsView:
    """The curves of a run's newest record (`telemetry.curves`): its reported metrics over
    steps, step time per node, its launches; thinned to a bounded number of points, or with
    `raw` every record of every segment. Raises when the run or its bucket is unknown."""
    from mncloud.records.store import load_current
    from mncloud.telemetry.curves import MAX_POINTS, metrics_view

    record = load_current(run_name)
    series = run_series(record, raw=raw)
    if series is None:
        raise MncloudError(
            f"run {run_name!r} has no readable telemetry: it needs a bucket (--bucket) or a "
            f"local checkpoint folder, and the bucket must be reachable"
        )
    return metrics_view(record.run_id, series, None if raw else MAX_POINTS)
