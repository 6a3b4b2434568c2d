"""Telemetry read in a time that does not grow with the run's length (`telemetry/rollup.py`):
each rank's rollup and the tail since it say what every segment says (exactly while a rollup
keeps every row; the stragglers and launches always; goodput to what `status` shows once
thinned); a torn or irregular series is read whole; and what `status NAME` opens of a run's
telemetry is the same for 10 steps and 2,000 (counted, never timed)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import layout
from mncloud.cli import app
from mncloud.operate import run_goodput, run_metrics
from mncloud.records.goodput import GoodputLedger, Telemetry, goodput_ledger, series_marks
from mncloud.records.model import Event, RunRecord
from mncloud.records.store import load_current
from mncloud.storage import join_key, open_bucket
from mncloud.telemetry import rollup
from mncloud.telemetry.curves import MAX_POINTS
from mncloud.telemetry.rollup import ROLLUP_EVERY, read_rollups
from mncloud.telemetry.series import Series, SeriesWriter, read_series, read_summary
from mncloud.telemetry.steps import from_series
from tests.longrun import launches_of, local_run, opened_under, write_run


def _same(full: Series, summary: Series, *, counts: bool = True) -> None:
    """Everything a reader shows of a series, the same from rollups as from every segment
    (the segments and torn ones counted too, unless `counts` is off: a merge counts one)."""
    assert summary.steps == full.steps
    assert summary.metrics == full.metrics
    assert summary.events == full.events
    assert summary.starts == full.starts
    if counts:
        assert (summary.segments, summary.skipped) == (full.segments, full.skipped)
    assert summary.launches() == full.launches()
    assert summary.curve("loss") == full.curve("loss")
    assert from_series(summary) == from_series(full)


def _ledger(series: Series, *launches: float) -> GoodputLedger:
    events = [Event(kind="launch" if not k else "restart", time=t, spot=True, hourly_price=36.0)
              for k, t in enumerate(launches)]  # fmt: skip
    record = RunRecord(
        run_id="r-20231114T221320-000001", name="r", user="u", host="h", created_at=0.0,
        backend="local", nodes=2, spec={}, task_yaml="",
        events=[*events, Event(kind="finish", time=max(r.t for r in series.steps) + 30)],
    )  # fmt: skip
    telemetry = Telemetry(steps=series_marks(series), checkpoints=[1900])
    return goodput_ledger(record, telemetry, now=0.0)


def test_rollups_and_their_tails_say_what_every_segment_says(bucket_uri: str) -> None:
    """Three ranks, relaunched, each with a stale rollup (a tail to fold), a torn segment in
    one tail and an event: the same series, row for row, as reading every segment (S3, GCS
    and a folder: a missing segment ends a tail at once)."""
    uri = f"{bucket_uri}/series"
    launches = launches_of(150, (100, 80))
    writers = write_run(uri, 3, launches, per_segment=15, ckpt_every=20, close=False)
    last = writers[-1]
    last.add({"k": "event", "t": 5e9, "event": "done", "weights_sha256": "ab"})
    assert last.flush()
    bucket, prefix = open_bucket(uri)
    torn = join_key(prefix, f"r00002-{last.launch}-{last.segments:05d}.jsonl")
    bucket.put_bytes(torn, b'{"k":"head","rank":2')
    summary, fetched = read_rollups(uri, 5.0)
    assert summary is not None and summary.windows
    full = read_series(uri)
    assert full.skipped == 1 and [e.event for e in full.events] == ["done"]
    _same(full, summary)
    assert fetched < full.segments  # the rollups and their tails, not every segment
    assert _ledger(summary, *(x.start for x in launches)) == _ledger(
        full, *(x.start for x in launches)
    )


def test_a_long_run_is_read_in_the_objects_of_a_short_one(tmp_path: Path) -> None:
    """16 ranks × 600 steps, relaunched (thinned: at most `MAX_ROWS` rows a rank) fetch as
    many objects as 16 × 10 (a rollup each); the stragglers and the launches are the full
    read's exactly; goodput's steps exactly, its shares and cents as shown."""
    counts, sizes = [], []
    for steps in (10, 600):
        uri = f"file://{tmp_path / str(steps)}/series"
        launches = launches_of(steps, (steps * 3 // 5, steps // 2))
        write_run(uri, 16, launches, slow={5: 1.001}, per_segment=max(1, steps // 4))
        summary, fetched = read_rollups(uri, 5.0)
        assert summary is not None
        counts.append(fetched)
        sizes.append(len(summary.steps))
        full = read_series(uri)
        assert from_series(summary) == from_series(full)
        assert summary.launches() == full.launches()
        assert max(len(points) for points in summary.metrics.values()) <= 32 * rollup.MAX_POINTS
        starts = [x.start for x in launches]
        a, b = _ledger(summary, *starts), _ledger(full, *starts)
        assert round(a.goodput or 0, 3) == round(b.goodput or 0, 3)
        for name, part in a.parts.items():
            assert part.steps == b.parts[name].steps, name
            assert abs(part.cents - b.parts[name].cents) <= 1, name
            assert part.node_seconds == pytest.approx(b.parts[name].node_seconds, abs=2.0)
    assert counts[0] == counts[1] == 2 * 16  # each launch's ranks: one rollup each, no tail
    assert sizes[1] <= 2 * 16 * rollup.MAX_ROWS


def test_a_torn_rollup_or_steps_that_go_back_read_every_segment(tmp_path: Path) -> None:
    """Read whole: a torn rollup; segments an older mncloud's reader merged into one and
    removed (its rollups' tails are gone); a rank whose steps went back."""
    from mncloud.telemetry import series as series_mod

    merged = f"file://{tmp_path / 'a'}/series"
    write_run(merged, 2, launches_of(40), per_segment=5)
    before = read_series(merged)
    bucket, prefix = open_bucket(merged)
    texts = {o.key: bucket.get_bytes(o.key).decode() for o in bucket.list("")
             if o.key.endswith(".jsonl")}  # fmt: skip
    series_mod._compact(bucket, prefix, texts)  # what a reader before rollups did
    assert read_rollups(merged, 5.0)[0] is None
    _same(before, read_summary(merged), counts=False)

    uri = f"file://{tmp_path / 'b'}/series"
    write_run(uri, 2, launches_of(40), per_segment=5)
    bucket, prefix = open_bucket(uri)
    (key,) = [o.key for o in bucket.list(join_key(prefix, "rollup/")) if "r00001" in o.key]
    bucket.put_bytes(key, b'{"v": 1, "rank": 1')
    assert read_rollups(uri, 5.0)[0] is None
    _same(read_series(uri), read_summary(uri))

    back = f"file://{tmp_path / 'c'}/series"
    w = SeriesWriter(back, 0, node=0, background=False)
    for step in (1, 2, 3, 2, 4):  # an epoch-local step counter: readers need every row
        w.add({"k": "step", "t": float(step * 10 + (step == 2) * 25), "step": step})
        assert w.flush()
    assert w.rollup is not None and w.rollup.irregular
    assert read_rollups(back, 5.0)[0] is None
    assert read_summary(back).steps == read_series(back).steps
    assert [r.step for r in read_summary(back).steps] == [1, 3, 4, 2]  # by time, once a step


def test_no_segment_is_written_without_its_rollup(tmp_path: Path) -> None:
    """The rollup goes first: while the bucket is down neither is written (the records wait),
    then both; a stale rollup is caught up on by the next reader through the tail."""
    blocker = tmp_path / "b"
    blocker.write_text("")  # a file where the bucket's folder would be: every write fails
    uri = f"file://{blocker}/series"
    w = SeriesWriter(uri, 0, node=0, background=False)
    w.add({"k": "step", "t": 1.0, "step": 1})
    assert not w.flush() and w.segments == 0
    blocker.unlink()
    assert w.flush()
    bucket, prefix = open_bucket(uri)
    assert prefix == ""
    names = sorted(o.key for o in bucket.list(""))
    assert names == [f"r00000-{w.launch}-00000.jsonl", f"rollup/r00000-{w.launch}.json"]
    for step in range(2, 2 + ROLLUP_EVERY - 1):
        w.add({"k": "step", "t": float(step), "step": step})
        assert w.flush()
    covered = json.loads(bucket.get_bytes(join_key(prefix, names[1])))["segments"]
    assert covered < w.segments
    _same(read_series(uri), read_summary(uri))


def _kind(path: str) -> str:
    return "rollup" if "/rollup/" in path else "segment" if path.endswith(".jsonl") else "other"


def _status(name: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["status", name, "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    return row


def test_status_opens_as_much_of_a_600_step_run_as_of_a_10_step_one(tmp_path: Path) -> None:
    """`status NAME` of 16 ranks: the same files of the run's bucket opened whatever its
    length (its ranks' rollups, once for stragglers and goodput; the final model's and the
    bandwidth's notes); its stragglers those of every record, its goodput the full read's to
    the percent it shows."""
    _status_reads_the_same(tmp_path, 600)


@pytest.mark.slow
def test_status_of_16_ranks_by_20000_steps_opens_what_10_steps_do(tmp_path: Path) -> None:
    """The issue's size (#57): 16 ranks × 20,000 steps, 10,672 segments."""
    _status_reads_the_same(tmp_path, 20_000)


def _status_reads_the_same(tmp_path: Path, long: int) -> None:
    opened, rows = [], []
    for steps in (10, long):
        name = f"run{steps}"
        launches = launches_of(steps)
        uri = local_run(name, str(tmp_path / "b"), 16, launches, slow={5: 1.6}, per_segment=100)
        with opened_under(tmp_path / "b" / name) as seen:
            rows.append(_status(name))
        opened.append(sorted(seen))
        full = read_series(uri)
        times = {r: s.sustained() for r, s in from_series(full).items()}
        assert rows[-1]["step_times"] == {str(r): t for r, t in times.items() if t is not None}
        record = load_current(name)
        telemetry = Telemetry(steps=series_marks(full))  # no checkpoint in the bucket
        expected = goodput_ledger(record, telemetry).goodput
        assert rows[-1]["goodput"] == pytest.approx(expected, abs=5e-4)
        ledger = run_goodput(record)
        assert ledger.goodput == pytest.approx(expected, abs=5e-4)
    kinds = [Counter(_kind(path) for path in seen) for seen in opened]
    # One read (stragglers and goodput share it): 16 rollups, and the segment after each
    # (none: the run is over).
    assert kinds[0] == kinds[1] == {"rollup": 16, "segment": 16, "other": 2}
    assert not any(Path(p).exists() for p in opened[1] if _kind(p) == "segment")
    assert rows[1]["stragglers"] == [5] and "straggler rank 5" in rows[1]["detail"]


def test_metrics_are_thinned_and_raw_gives_every_record(tmp_path: Path) -> None:
    """`metrics` draws at most `MAX_POINTS` points a curve; `--raw` every step's."""
    local_run("m", str(tmp_path / "b"), 2, launches_of(1500))
    thinned, raw = run_metrics("m"), run_metrics("m", raw=True)
    assert 0 < len(thinned.metrics["loss"]) <= MAX_POINTS
    assert [p.step for p in raw.metrics["loss"]] == list(range(1, 1501))
    assert thinned.metrics["loss"][-1] == raw.metrics["loss"][-1]
    assert thinned.launches == raw.launches
    out = CliRunner().invoke(app, ["metrics", "m", "--raw", "--json"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)["metrics"]["loss"]) == 1500
    assert layout.series_uri  # the run's telemetry stays whole for whoever asks
