"""Events in the telemetry segments, the writer's prompt flushes, and `SeriesTail`, the
incremental read a live run's pollers use (`mncloud/telemetry/series.py`, `seriestail.py`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mncloud import constants, layout
from mncloud.storage import join_key, open_bucket
from mncloud.telemetry.series import SeriesWriter, read_series
from mncloud.telemetry.seriestail import SeriesTail


def _names(uri: str) -> list[str]:
    """The segments' names (not the rollups')."""
    bucket, prefix = open_bucket(uri)
    keys = [o.key for o in bucket.list(f"{prefix}/" if prefix else "")]
    return sorted(k.rsplit("/", 1)[-1] for k in keys if k.endswith(".jsonl"))


def test_events_round_trip_and_unknown_kinds_are_skipped(tmp_path: Path) -> None:
    """An event keeps its fields; its own `node` (a replica's number) wins over the head's; a
    record of a kind this code does not know is skipped, the segment is not."""
    uri = f"file://{tmp_path / 'b'}/series"
    w = SeriesWriter(uri, 0, node=0, background=False)
    w.add({"k": "event", "t": 1.0, "event": "start", "resumed_from": 20})
    w.add({"k": "step", "t": 2.0, "step": 21})
    w.add({"k": "someday", "t": 2.5, "x": 1})
    w.add({"k": "event", "t": 3.0, "event": "heal", "node": 2, "from_step": 3, "step": 21})
    assert w.flush()
    series = read_series(uri)
    assert series.skipped == 0 and [r.step for r in series.steps] == [21]
    start, heal = series.events
    assert (start.event, start.node, start.data) == ("start", 0, {"resumed_from": 20})
    assert (heal.event, heal.node, heal.data["from_step"]) == ("heal", 2, 3)


def _wait_for(uri: str, count: int, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(names := _names(uri)) >= count:
            return names
        time.sleep(0.02)
    raise AssertionError(f"{count} segment(s) never written: {_names(uri)}")


def test_a_launchs_first_step_and_events_are_written_at_once(tmp_path: Path) -> None:
    """With a minute between segments, the first step and an event still reach the bucket
    within moments (the local supervisor and node recovery wait on them); later steps wait."""
    uri = f"file://{tmp_path / 'b'}/series"
    w = SeriesWriter(uri, 0, interval=60.0)
    try:
        w.add({"k": "step", "t": time.time(), "step": 1})
        _wait_for(uri, 1)
        w.add({"k": "step", "t": time.time(), "step": 2})
        time.sleep(0.5)
        assert len(_names(uri)) == 1  # an ordinary step waits for the interval
        w.add({"k": "event", "t": time.time(), "event": "done"})
        _wait_for(uri, 2)
    finally:
        w.close()
    series = read_series(uri)
    assert [r.step for r in series.steps] == [1, 2] and [e.event for e in series.events] == ["done"]


def test_report_and_event_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mncloud.train.steptime.event` writes through the rank's writer; outside a run, nothing."""
    pytest.importorskip("torch", reason="mncloud.train needs torch")
    from mncloud.train import steptime

    monkeypatch.setattr(steptime, "_series", None)
    monkeypatch.delenv(constants.RUN_ID_ENV, raising=False)
    steptime.event("start", resumed_from=0)  # no run: a no-op
    assert steptime._series is False
    ckpt = f"file://{tmp_path / 'b'}/exp"
    monkeypatch.setenv(constants.CKPT_URI_ENV, ckpt)
    monkeypatch.setenv(constants.RUN_ID_ENV, "exp-1")
    monkeypatch.setattr(steptime, "_series", None)
    steptime.event("start", resumed_from=7, odd=object())  # an odd field is written as text
    steptime.report(8, loss=0.5)
    steptime._series.close()
    series = read_series(layout.series_uri(ckpt, "exp-1"))
    (start,) = series.events
    assert start.data["resumed_from"] == 7 and isinstance(start.data["odd"], str)
    assert [r.step for r in series.steps] == [8]


def test_a_tail_reads_each_segment_once_across_a_compaction(tmp_path: Path) -> None:
    """Each `read` returns only what new segments add; a compaction by another reader (of a
    series written before rollups: it is never compacted since) brings nothing back twice; a
    torn segment is skipped and counted once."""
    from mncloud.telemetry import series as series_mod

    uri = f"file://{tmp_path / 'b'}/series"
    w = SeriesWriter(uri, 0, node=0, background=False, rollup=False)
    tail = SeriesTail(uri)
    assert tail.read().steps == []
    for step in range(1, series_mod.COMPACT_AT + 1):
        w.add({"k": "step", "t": float(step), "step": step, "m": {"loss": 1 / step}})
        assert w.flush()
    w.add({"k": "event", "t": 16.5, "event": "quorum", "replicas": [0, 1]})
    assert w.flush()
    first = tail.read()
    assert [r.step for r in first.steps] == list(range(1, series_mod.COMPACT_AT + 1))
    assert [e.event for e in first.events] == ["quorum"] and len(first.metrics["loss"]) == 16
    assert tail.read().steps == [] and tail.read().events == []
    read_series(uri, compact=True)
    assert any(n.startswith("c-") for n in _names(uri))
    w.add({"k": "step", "t": 20.0, "step": 20})
    assert w.flush()
    bucket, prefix = open_bucket(uri)
    bucket.put_bytes(join_key(prefix, "r00009-x-00000.jsonl"), b'{"k": "head"')
    after = tail.read()
    assert [r.step for r in after.steps] == [20] and after.events == [] and tail.skipped == 1
    assert tail.read().steps == [] and tail.skipped == 1


def test_a_tail_of_a_missing_bucket_is_empty(tmp_path: Path) -> None:
    tail = SeriesTail(f"file://{tmp_path / 'nothing'}/series")
    assert tail.read().steps == [] and tail.skipped == 0
