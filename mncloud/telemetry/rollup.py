"""Each process's rollup: what its telemetry segments say, kept to a bounded size, so that
`status`, `metrics`, goodput and the web view read a run in a time that does not grow with
its length.

A rank's writer (`telemetry.series.SeriesWriter`) folds each segment it wrote into its
`Rollup` and writes it as one object beside them, `rollup/r00003-<launch>.json`: before its
first segment (so no segment is ever without one), after every `ROLLUP_EVERY` segments and at
its end. A reader (`read_rollups`) lists the rollups, fetches each and folds the segments
written since (`r00003-<launch>-<n>.jsonl` from the `n` it covers, one GET each until one is
missing), so it reads the rollups plus their tails, never the whole run. Both sides fold with
the same code (`Rollup.take` parses a segment with `segments.parse`): a rollup and its tail
give what folding every segment gives, and a stale rollup only makes the tail longer. Example,
rank 3 at one segment every 30 s:

    rollup/r00003-<L>.json     covers segments 0..15 (written after the 16th)
    r00003-<L>-00016.jsonl     the tail a reader folds itself, then 00018 is missing: done
    r00003-<L>-00017.jsonl

What a rollup keeps of its process:
- its step rows, every one up to `MAX_ROWS`; past that, thinned: the rows whose index in the
  process is a multiple of a stride (doubled as needed), each standing for the rows folded
  into it (`StepRow.n`, their `ckpt_s` summed); its first and newest rows are always kept;
- its step-time windows (`telemetry.steps`: stragglers), exact: each window's sums as its
  gaps come and the last `WINDOW` gaps;
- each metric's points, thinned the same way (`MAX_POINTS`); a thinned-out point is dropped;
- its newest `MAX_EVENTS` events, its start time, the segments it took and skipped (torn).

A reader falls back to every segment (`series.read_series`, the caller's choice) when the
rollups cannot stand for the records: a process whose steps or clock went back (`irregular`),
a rollup that cannot be read, or segments an older reader compacted (`c-*.jsonl`).
"""

from __future__ import annotations

import json
from typing import Any

from mncloud.telemetry.segments import (
    SUSTAINED_WINDOWS,
    WINDOW,
    EventRow,
    Point,
    RankWindows,
    Series,
    StepRow,
    parse,
    segment_name,
)

#: Step rows a rollup keeps at most (then every other one is folded into the next).
MAX_ROWS = 256
#: Points of each metric a rollup keeps at most (then every other one is dropped).
MAX_POINTS = 512
#: Events a rollup keeps (the newest).
MAX_EVENTS = 256
#: A writer rewrites its rollup after this many segments (a reader's tail is shorter).
ROLLUP_EVERY = 4
#: The folder of the rollups under a series URI.
ROLLUP_DIR = "rollup"
VERSION = 1


def rollup_name(rank: int, launch: str) -> str:
    """A process's rollup key under its series URI."""
    return f"{ROLLUP_DIR}/r{rank:05d}-{launch}.json"


class Rollup:
    """One process's telemetry folded to a bounded size (module docstring)."""

    def __init__(self, rank: int, launch: str, node: Any = None, t0: float | None = None) -> None:
        self.rank, self.launch, self.node, self.t0 = rank, launch, node, t0
        self.segments = 0
        """Segments taken: its segments 0..segments-1 (torn ones included)."""
        self.skipped = 0
        self.irregular = ""
        """Why the rollup cannot stand for its records ("" when it can)."""
        self.count = 0
        """Step rows taken (one per step: a step reported again is merged into its row)."""
        self.stride = 1
        self.rows: list[list[Any]] = []
        """[index, t, step, folded ckpt_s, own ckpt_s, n] per kept row, oldest first."""
        self.chunk: list[Any] = [0, 0, 0]
        """The window being filled: [gaps, seconds, steps]."""
        self.done: list[list[Any]] = []
        """The last `SUSTAINED_WINDOWS` full windows: [mean seconds per step, steps]."""
        self.recent: list[list[Any]] = []
        """The last `WINDOW` gaps: [seconds, steps]."""
        self.metrics: dict[str, list[Any]] = {}
        """Each metric: [stride, points taken, [[index, t, step, value], …]]."""
        self.events: list[list[Any]] = []
        """[t, event, node, data] of the newest `MAX_EVENTS` events."""
        self.dropped_events = 0

    def take(self, text: str) -> None:
        """Fold one segment of this process (the next one) into the rollup."""
        self.segments += 1
        part = Series()
        try:
            parse(text, part)
        except (ValueError, KeyError, TypeError, ArithmeticError):  # as `read_series` skips
            self.skipped += 1
            return
        rows = [*part.steps, *part.events, *(p for ps in part.metrics.values() for p in ps)]
        if any(r.launch != self.launch or r.rank != self.rank for r in rows):
            self.irregular = "a segment of another process"
            return
        self.t0 = self.t0 or part.starts.get(self.launch)
        if part.steps and self.node is None:
            self.node = part.steps[0].node
        for row in part.steps:
            self._step(row.t, row.step, row.ckpt_s)
        for name, points in part.metrics.items():
            for point in points:
                self._point(name, point.t, point.step, point.value)
        for e in part.events:
            self.events.append([e.t, e.event, e.node, e.data])
        if len(self.events) > MAX_EVENTS:
            self.dropped_events += len(self.events) - MAX_EVENTS
            del self.events[:-MAX_EVENTS]

    def _step(self, t: float, step: int, ckpt_s: float) -> None:
        """One step row, as `segments.merged` keeps rows: one per step, the earliest, with
        the largest stall; rows that would sort otherwise by time make the rollup irregular."""
        last = self.rows[-1] if self.rows else None
        if last is not None and (t < last[1] or step < last[2]):
            self.irregular = self.irregular or f"step {step} at {t} came after step {last[2]}"
            return
        if last is not None and step == last[2]:
            last[4] = max(last[4], ckpt_s)
            return
        row = [self.count, t, step, 0.0, ckpt_s, 1]
        if last is not None:
            self._gap(t - last[1], step - last[2])
            if last[0] % self.stride:  # off the grid and no longer the newest: folded in
                self.rows.pop()
                row[3], row[5] = last[3] + last[4], last[5] + 1
        self.rows.append(row)
        self.count += 1
        if len(self.rows) > MAX_ROWS:
            self.stride *= 2
            self.rows = _thinned(self.rows, self.stride)

    def _gap(self, seconds: float, steps: int) -> None:
        """One gap between rows, into the windows (`telemetry.steps.from_series`)."""
        if not (steps > 0 and seconds > 0):
            return
        self.recent.append([seconds, steps])
        if len(self.recent) > WINDOW:
            del self.recent[0]
        self.chunk = [self.chunk[0] + 1, self.chunk[1] + seconds, self.chunk[2] + steps]
        if self.chunk[0] == WINDOW:
            self.done.append([self.chunk[1] / self.chunk[2], self.chunk[2]])
            del self.done[:-SUSTAINED_WINDOWS]
            self.chunk = [0, 0, 0]

    def _point(self, name: str, t: float, step: int, value: float) -> None:
        """One metric point: the first of a step is kept; steps that go back are irregular."""
        entry = self.metrics.setdefault(name, [1, 0, []])
        stride, points = entry[0], entry[2]
        if points and step < points[-1][2]:
            self.irregular = self.irregular or f"metric {name} went back to step {step}"
            return
        if points and step == points[-1][2]:
            return
        if points and points[-1][0] % stride:
            points.pop()  # off the grid, and no longer the newest
        points.append([entry[1], t, step, value])
        entry[1] += 1
        if len(points) > MAX_POINTS:
            entry[0] = stride = stride * 2
            entry[2] = [p for p in points[:-1] if p[0] % stride == 0] + points[-1:]

    def windows(self) -> RankWindows | None:
        """Its step-time windows, as `telemetry.steps.from_series` cuts them; None without
        a timed gap."""
        if not self.done and not self.chunk[0]:
            return None
        cut = [(m, n) for m, n in self.done]
        if self.chunk[0]:
            cut.append((self.chunk[1] / self.chunk[2], self.chunk[2]))
        mean = sum(t for t, _ in self.recent) / sum(n for _, n in self.recent)
        return RankWindows(mean, self.rows[-1][2], tuple(cut[-SUSTAINED_WINDOWS:]))

    def step_rows(self) -> list[StepRow]:
        return [
            StepRow(t, step, self.rank, self.node, self.launch, folded + own, n)
            for _, t, step, folded, own, n in self.rows
        ]

    def to_json(self) -> bytes:
        return json.dumps(
            {"v": VERSION, **{k: getattr(self, k) for k in _FIELDS}}, separators=(",", ":")
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Rollup:
        """A rollup from its object; ValueError/KeyError/TypeError when it is not one."""
        raw = json.loads(data)
        if raw.get("v") != VERSION:
            raise ValueError(f"rollup version {raw.get('v')!r}")
        found = cls(int(raw["rank"]), str(raw["launch"]))
        for key in _FIELDS:
            setattr(found, key, raw[key])
        if not all(isinstance(x, int) for x in (found.segments, found.count, found.stride)):
            raise TypeError("rollup counts are not integers")
        return found


_FIELDS = ("rank", "launch", "node", "t0", "segments", "skipped", "irregular", "count", "stride",
           "rows", "chunk", "done", "recent", "metrics", "events", "dropped_events")  # fmt: skip


def _thinned(rows: list[list[Any]], stride: int) -> list[list[Any]]:
    """The rows on the grid of `stride` and the newest; each other one folded into the next."""
    out: list[list[Any]] = []
    folded, n = 0.0, 0
    for row in rows:
        if n:
            row[3], row[5] = row[3] + folded, row[5] + n
        if row[0] % stride == 0 or row is rows[-1]:
            out.append(row)
            folded, n = 0.0, 0
        else:
            folded, n = row[3] + row[4], row[5]
    return out


def series_of(rollups: list[Rollup], metrics: bool = True) -> Series:
    """The series the rollups stand for (ordered as `series.read_series` orders a full read),
    its rows and points thinned (no points without `metrics`), each rank's windows exact."""
    rollups = sorted(rollups, key=lambda r: (r.rank, r.launch))
    out = Series(windows={})
    rows: list[StepRow] = []
    newest: dict[int, tuple[float, int, Rollup]] = {}
    for k, roll in enumerate(rollups):
        out.segments += roll.segments
        out.skipped += roll.skipped
        if roll.t0:
            out.starts.setdefault(roll.launch, float(roll.t0))
        mine = roll.step_rows()
        rows += mine
        if mine and (roll.rank not in newest or (mine[-1].t, k) >= newest[roll.rank][:2]):
            newest[roll.rank] = (mine[-1].t, k, roll)
        for name, (_, _, points) in roll.metrics.items() if metrics else ():
            out.metrics.setdefault(name, []).extend(
                Point(t, step, value, roll.launch, roll.rank) for _, t, step, value in points
            )
        out.events += [EventRow(t, str(e), roll.rank, node, roll.launch, dict(data))
                       for t, e, node, data in roll.events]  # fmt: skip
    out.steps = sorted(rows, key=lambda r: (r.t, r.rank))
    once = {(e.launch, e.rank, e.t, e.event): e for e in out.events}
    out.events = sorted(once.values(), key=lambda e: e.t)
    for points in out.metrics.values():
        points.sort(key=lambda p: p.t)
    assert out.windows is not None
    for rank, (_, _, roll) in sorted(newest.items()):
        found = roll.windows()
        if found is not None:
            out.windows[rank] = found
    return out


def read_rollups(
    uri: str, retry_seconds: float, *, metrics: bool = True
) -> tuple[Series | None, int]:
    """The series under `uri` read through its rollups and their tails, with the objects
    fetched; None when it has no rollups or they cannot stand for it: then read every segment
    (`series.read_series`). An older reader's compaction (every segment merged into one
    `c-*.jsonl`, the segments removed) shows as a rollup whose last covered segment is gone."""
    from mncloud.storage import ObjectNotFoundError, join_key, open_bucket

    bucket, prefix = open_bucket(uri, retry_seconds=retry_seconds)
    listed = [o.key for o in bucket.list(join_key(prefix, ROLLUP_DIR) + "/")]
    rollups, fetched = [], 0
    for key in (k for k in listed if k.endswith(".json")):
        try:
            roll = Rollup.from_json(bucket.get_bytes(key))
        except (ObjectNotFoundError, ValueError, KeyError, TypeError, ArithmeticError):
            return None, fetched
        fetched, covered = fetched + 1, roll.segments
        while not roll.irregular:
            name = join_key(prefix, segment_name(roll.rank, roll.launch, roll.segments))
            try:
                text = bucket.get_bytes(name).decode(errors="replace")
            except ObjectNotFoundError:
                break
            fetched += 1
            roll.take(text)
        gone = roll.segments == covered > 0 and not bucket.exists(
            join_key(prefix, segment_name(roll.rank, roll.launch, covered - 1))
        )
        if roll.irregular or gone:
            return None, fetched
        rollups.append(roll)
    if not rollups:
        return None, fetched
    try:
        return series_of(rollups, metrics), fetched
    except (ValueError, KeyError, TypeError, ArithmeticError):  # not a rollup we wrote
        return None, fetched
