"""The telemetry segments' format: a segment's head and records read into rows, and the
`Series` they merge into (steps per rank and launch, metric points, events, launch starts).

A segment (`telemetry.series` writes them) is JSON lines: a head line naming the rank, its
node and launch, then its records; a compacted one holds several head blocks. `parse` reads
one segment's text into a `Series` or raises ValueError/KeyError/TypeError when it is torn or
malformed (readers skip it and count it). The whole-series reader (`series.read_series`), the
live tail (`seriestail`) and the rollups (`rollup`) all read segments through it, so they
agree on what a segment says.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

SUFFIX = ".jsonl"


def segment_name(rank: int, launch: str, seq: int) -> str:
    """Segment `seq` of a process (rank, launch tag) under its series URI, counted from 0."""
    return f"r{rank:05d}-{launch}-{seq:05d}{SUFFIX}"


@dataclass(frozen=True)
class StepRow:
    """One finished step of one rank in one launch."""

    t: float
    step: int
    rank: int
    node: int | None
    launch: str
    ckpt_s: float = 0.0
    n: int = 1
    """The steps this row stands for: itself and, in a thinned rollup (`telemetry.rollup`),
    the rows of its process before it that were folded into it (their `ckpt_s` summed)."""


@dataclass(frozen=True)
class EventRow:
    """One event of one rank (module docstring): its name and its other fields in `data`."""

    t: float
    event: str
    rank: int
    node: int | None
    launch: str
    data: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Point:
    """One reported value of a metric."""

    t: float
    step: int
    value: float
    launch: str
    rank: int = 0


@dataclass(frozen=True)
class RankWindows:
    """One rank's newest launch's step times, cut as `telemetry.steps.from_series` cuts them."""

    seconds_per_step: float
    """The mean over its last `WINDOW` timed steps' gaps."""
    step: int
    """Its newest step."""
    windows: tuple[tuple[float, int], ...]
    """Its last `SUSTAINED_WINDOWS` windows, oldest first: (mean seconds per step, steps)."""


#: Step gaps per straggler window, and the windows kept (`telemetry.steps`).
WINDOW = 50
SUSTAINED_WINDOWS = 3


@dataclass(frozen=True)
class Launch:
    """One launch of the gang: its ranks' processes (tags), their start, their steps' span."""

    tags: frozenset[str]
    t0: float
    first_t: float
    last_t: float
    first_step: int
    last_step: int


def _group_launches(rows: dict[str, list[StepRow]], starts: dict[str, float]) -> list[Launch]:
    """Processes grouped into launches: a gang's ranks all start before any of them finishes
    a step (they meet first), so a process started after its group's first step is the start
    of the next launch. Example: ranks 0, 1 start at t=0, 0.3, first step t=5; rank 0 and 1
    start again at t=60, 60.2: two launches."""
    spans = sorted(((starts.get(tag, r[0].t), tag, r) for tag, r in rows.items()))
    groups: list[list[tuple[float, str, list[StepRow]]]] = []
    for span in spans:
        if groups and span[0] < min(r[0].t for _, _, r in groups[-1]):
            groups[-1].append(span)
        else:
            groups.append([span])
    out = []
    for group in groups:
        low = min(group, key=lambda g: g[2][0].rank)[2]
        out.append(Launch(
            frozenset(tag for _, tag, _ in group), min(t for t, _, _ in group),
            min(r[0].t for _, _, r in group), max(r[-1].t for _, _, r in group),
            low[0].step, max(row.step for _, _, r in group for row in r),
        ))  # fmt: skip
    return out


@dataclass
class Series:
    """Every rank's telemetry of a run, compacted: rows sorted by time."""

    steps: list[StepRow] = field(default_factory=list)
    metrics: dict[str, list[Point]] = field(default_factory=dict)
    events: list[EventRow] = field(default_factory=list)
    starts: dict[str, float] = field(default_factory=dict)
    """Each launch tag's process start time (from its segments' head lines)."""
    segments: int = 0
    skipped: int = 0
    """Segments that were torn or malformed and left out."""
    windows: dict[int, RankWindows] | None = None
    """Each rank's step-time windows as its rollup kept them, when the series was read through
    the rollups (`telemetry.rollup`: then `steps` and `metrics` are thinned to a bounded
    number of rows); None when `steps` holds every row (`telemetry.steps` cuts them)."""

    def curve(self, name: str) -> list[Point]:
        """A metric as one record per run (ClearML-style): at each step of each launch the
        value of the lowest rank that reported it (each rank reports its own; one rank's
        last segment may be lost to a preemption), in time order."""
        group = {tag: k for k, launch in enumerate(self.launches()) for tag in launch.tags}
        best: dict[tuple[int, int], Point] = {}
        for point in self.metrics.get(name, []):
            key = (group.get(point.launch, 0), point.step)
            if key not in best or point.rank < best[key].rank:
                best[key] = point
        return sorted(best.values(), key=lambda p: p.t)

    def launches(self) -> list[Launch]:
        """The gang's launches in time order (`_group_launches`)."""
        rows: dict[str, list[StepRow]] = {}
        for row in self.steps:
            rows.setdefault(row.launch, []).append(row)
        return _group_launches(rows, self.starts)


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """A segment's (head line, record lines) blocks (a compacted one holds several); raises
    ValueError when it is torn or does not start with a head line."""
    lines = text.splitlines()
    if not text.endswith("\n") or not lines:
        raise ValueError("torn segment")
    found: list[tuple[str, list[str]]] = []
    for line in lines:
        if json.loads(line).get("k") == "head":
            found.append((line, []))
        elif not found:
            raise ValueError("no head line")
        else:
            found[-1][1].append(line)
    return found


def parse(text: str, series: Series) -> None:
    """Add one segment's records to `series`; raises ValueError/KeyError/TypeError when torn
    (each line is decoded once: a reader's cost is its records)."""
    lines = text.splitlines()
    if not text.endswith("\n") or not lines:
        raise ValueError("torn segment")
    steps: list[StepRow] = []
    points: list[tuple[str, Point]] = []
    events: list[EventRow] = []
    starts: dict[str, float] = {}
    head: dict[str, Any] | None = None
    for line in lines:
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise TypeError("a line that is not a record")
        if rec.get("k") == "head":
            head = rec
            rank, node, launch = int(head["rank"]), head.get("node"), str(head["launch"])
            if head.get("t0"):
                starts[launch] = float(head["t0"])
            continue
        if head is None:
            raise ValueError("no head line")
        if rec.get("k") == "event":
            data = {k: v for k, v in rec.items() if k not in ("k", "t", "event")}
            at = data.get("node", node)
            events.append(EventRow(float(rec["t"]), str(rec["event"]), rank,
                                   None if at is None else int(at), launch, data))  # fmt: skip
            continue
        if rec.get("k") != "step":
            continue
        t, step = float(rec["t"]), int(rec["step"])
        steps.append(StepRow(t, step, rank, node, launch, float(rec.get("ckpt_s") or 0.0)))
        for name, value in (rec.get("m") or {}).items():
            if math.isfinite(float(value)):
                points.append((name, Point(t, step, float(value), launch, rank)))
    series.steps += steps
    series.events += events
    for launch, t0 in starts.items():
        series.starts.setdefault(launch, t0)
    for name, point in points:
        series.metrics.setdefault(name, []).append(point)


def merged(rows: list[StepRow]) -> list[StepRow]:
    """One row per (launch, rank, step): the earliest, with the largest stall; by time."""
    best: dict[tuple[str, int, int], StepRow] = {}
    for row in sorted(rows, key=lambda r: r.t):
        key = (row.launch, row.rank, row.step)
        seen = best.get(key)
        if seen is None:
            best[key] = row
        elif row.ckpt_s > seen.ckpt_s:
            best[key] = StepRow(seen.t, seen.step, seen.rank, seen.node, seen.launch, row.ckpt_s)
    return sorted(best.values(), key=lambda r: (r.t, r.rank))
