"""Training telemetry through the bucket: ranks append JSONL segments; readers compact them.

One mechanism for every backend (a cloud bucket or a local run's `file://` one). Each rank
buffers small records in memory and a daemon thread writes them, at most every
`FLUSH_INTERVAL_S`, as one new object under `layout.series_uri(ckpt, run_id)`:

    r00003-<launch>-00007.jsonl      rank 3, its launch's tag, the 8th segment of that launch
    {"k": "head", "rank": 3, "node": 1, "launch": "…", "t0": 1700000000.0}
    {"k": "step", "t": 1700000031.2, "step": 120, "m": {"loss": 2.31}}
    {"k": "step", "t": 1700000031.4, "step": 121, "ckpt_s": 0.8}
    {"k": "event", "t": 1700000032.0, "event": "done", "node": 1, "weights_sha256": "…"}

Events are what is not a step: a launch's `start` (`resumed_from`), `done`, a replica's
`join`, `quorum` and `heal` under node recovery (`node` names the replica), a bandwidth
figure. A launch's first step and every event are written at once (readers wait on them: the
local supervisor's first step, node recovery's replica news); the rest waits for the interval.
A record of a kind this code does not know is skipped, not an error.

A segment is never rewritten (the launch tag is the process's start time and pid, the sequence
number counts up), so a preempted rank's last segment is at worst missing, never half a
replacement. Reading lists every segment, skips a torn or malformed one (counted in
`Series.skipped`) and merges them into one `Series`: steps with their times per rank and
launch, the metrics over steps, the events, and each launch's first step. A live reader
polls with `SeriesTail` (`telemetry.seriestail`), which fetches only the segments it has not
read. Training never waits on it: a record is a list append; the bucket is written off the
training thread and its errors logged.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mncloud import constants, layout

log = logging.getLogger(__name__)

#: Seconds between a rank's segment writes (objects per rank per hour = 3600 / this at most).
FLUSH_INTERVAL_S = 30.0
#: Records a rank keeps buffered at most (older ones are dropped if the bucket is down).
MAX_BUFFER = 200_000
#: A compacting read merges the segments into one once there are at least this many.
COMPACT_AT = 16
#: Reads of the segments give up after this long.
READ_RETRY_SECONDS = 5.0
SUFFIX = ".jsonl"


def finite_metrics(metrics: Mapping[str, object]) -> tuple[dict[str, float], list[str]]:
    """The finite scalars of `metrics` and the names dropped (not a finite number)."""
    kept: dict[str, float] = {}
    dropped: list[str] = []
    for name, value in metrics.items():
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            dropped.append(name)
            continue
        if math.isfinite(number) and not isinstance(value, bool):
            kept[name] = number
        else:
            dropped.append(name)
    return kept, dropped


class SeriesWriter:
    """One rank's telemetry: `add` buffers a record, a daemon thread writes segments."""

    def __init__(
        self,
        uri: str,
        rank: int,
        *,
        node: int | None = None,
        interval: float = FLUSH_INTERVAL_S,
        background: bool = True,
    ) -> None:
        self.uri, self.rank, self.node, self.interval = uri, rank, node, interval
        self.t0 = _process_start()
        self.launch = f"{int(self.t0 * 1000):x}-{os.getpid():x}"
        self.segments = 0
        self._stepped = False
        self._buffer: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._bucket: tuple[Any, str] | None = None
        """The bucket and key prefix, opened on the first write and kept for every segment
        (its S3 client is the process's: `storage.s3.make_client`)."""
        if background:
            self._thread = threading.Thread(target=self._loop, name="mncloud-series", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def add(self, record: dict[str, Any]) -> None:
        """Buffer one record (cheap); a step reported again (a save's `maybe_save`, then the
        script's metrics) is merged into the buffered one of that step. An event or this
        launch's first step wakes the writer's thread to write it now."""
        kind = record.get("k")
        urgent = kind == "event" or (kind == "step" and not self._stepped)
        self._stepped = self._stepped or kind == "step"
        with self._lock:
            last = self._buffer[-1] if self._buffer else None
            same = last is not None and last.get("k") == "step" == kind
            if same and last is not None and last.get("step") == record.get("step"):
                metrics = {**last.get("m", {}), **record.get("m", {})}
                last.update({**record, "t": last["t"]}, **({"m": metrics} if metrics else {}))
                return
            if len(self._buffer) >= MAX_BUFFER:
                del self._buffer[: MAX_BUFFER // 10]
            self._buffer.append(record)
        if urgent:  # after the append: the thread's flush takes it
            self._wake.set()

    def flush(self) -> bool:
        """Write the buffered records as one new segment; False when there was nothing or the
        bucket failed (the records are kept for the next try)."""
        with self._lock:
            records, self._buffer = self._buffer, []
        if not records:
            return False
        head = {"k": "head", "rank": self.rank, "node": self.node, "launch": self.launch,
                "t0": self.t0}  # fmt: skip
        lines = (json.dumps(r, separators=(",", ":"), default=str) for r in [head, *records])
        body = "\n".join(lines) + "\n"
        name = f"r{self.rank:05d}-{self.launch}-{self.segments:05d}{SUFFIX}"
        try:
            from mncloud.storage import join_key, open_bucket

            if self._bucket is None:
                self._bucket = open_bucket(self.uri, retry_seconds=2.0)
            bucket, prefix = self._bucket
            bucket.put_bytes(join_key(prefix, name), body.encode())
        except Exception as err:  # telemetry must never break training
            log.warning("telemetry segment not written (kept for the next try): %s", err)
            with self._lock:
                self._buffer[:0] = records
            return False
        self.segments += 1
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is buffered and stop the thread (at exit; bounded)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        else:
            self.flush()

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()
        self.flush()


def _process_start() -> float:
    """When this process started (seconds since the epoch): its launch's start on this rank."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


def writer_from_env(environ: Mapping[str, str] | None = None) -> SeriesWriter | None:
    """The writer of this process's rank in a run (`MNCLOUD_CKPT_URI`, `MNCLOUD_RUN_ID`,
    `RANK`, `SKYPILOT_NODE_RANK`), or None outside one."""
    env = os.environ if environ is None else environ
    ckpt, run_id = env.get(constants.CKPT_URI_ENV), env.get(constants.RUN_ID_ENV)
    if not ckpt or not run_id:
        return None
    node = env.get(constants.SKYPILOT_NODE_RANK)
    interval = env.get(constants.TELEMETRY_INTERVAL_ENV)
    return SeriesWriter(
        layout.series_uri(ckpt, run_id),
        int(env.get("RANK", "0")),
        node=int(node) if node and node.isdigit() else None,
        interval=float(interval) if interval else FLUSH_INTERVAL_S,
    )


@dataclass(frozen=True)
class StepRow:
    """One finished step of one rank in one launch."""

    t: float
    step: int
    rank: int
    node: int | None
    launch: str
    ckpt_s: float = 0.0


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


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """A segment's (head line, record lines) blocks (a compacted one holds several); raises
    ValueError when it is torn or does not start with a head line."""
    lines = text.splitlines()
    if not text.endswith("\n") or not lines:
        raise ValueError("torn segment")
    blocks: list[tuple[str, list[str]]] = []
    for line in lines:
        if json.loads(line).get("k") == "head":
            blocks.append((line, []))
        elif not blocks:
            raise ValueError("no head line")
        else:
            blocks[-1][1].append(line)
    return blocks


def _parse(text: str, series: Series) -> None:
    """Add one segment's records to `series`; raises ValueError/KeyError/TypeError when torn."""
    steps: list[StepRow] = []
    points: list[tuple[str, Point]] = []
    events: list[EventRow] = []
    starts: dict[str, float] = {}
    for head_line, lines in _blocks(text):
        head = json.loads(head_line)
        rank, node, launch = int(head["rank"]), head.get("node"), str(head["launch"])
        if head.get("t0"):
            starts[launch] = float(head["t0"])
        for line in lines:
            rec = json.loads(line)
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


def _merged(rows: list[StepRow]) -> list[StepRow]:
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


def read_series(uri: str, *, compact: bool = False) -> Series:
    """Every segment under a series URI (`layout.series_uri`), merged (module docstring).

    With `compact`, once `COMPACT_AT` readable segments are there they are written again as
    one (`_compact`) and removed, so later reads list and fetch one object where there were
    many. A segment removed by another reader's compaction between the listing and its
    fetch makes the read start over (its content is in that reader's compacted segment)."""
    from mncloud.storage import ObjectNotFoundError, open_bucket

    bucket, prefix = open_bucket(uri, retry_seconds=READ_RETRY_SECONDS)
    for attempt in range(3):
        series, texts = Series(), dict[str, str]()
        try:
            for obj in bucket.list(f"{prefix}/" if prefix else ""):
                if obj.key.endswith(SUFFIX):
                    series.segments += 1
                    texts[obj.key] = bucket.get_bytes(obj.key).decode(errors="replace")
        except ObjectNotFoundError:
            if attempt == 2:
                raise
            continue
        break
    good: dict[str, str] = {}
    for key, text in texts.items():
        try:
            _parse(text, series)
            good[key] = text
        except (ValueError, KeyError, TypeError) as err:
            log.warning("telemetry segment %s skipped: %s", key, err)
            series.skipped += 1
    series.steps = _merged(series.steps)
    once = {(e.launch, e.rank, e.t, e.event): e for e in series.events}  # compactions overlap
    series.events = sorted(once.values(), key=lambda e: e.t)
    for points in series.metrics.values():
        points.sort(key=lambda p: p.t)
    if compact and len(good) >= COMPACT_AT:
        _compact(bucket, prefix, good)
    return series


def _compact(bucket: Any, prefix: str, texts: dict[str, str]) -> None:
    """Write `texts` (key → segment) as one segment, each head's records once, then remove
    them. Its name is a digest of what it holds, so two readers compacting the same segments
    write the same object; where their sets differ, the records they share are merged by
    every read (one row per launch, rank and step) and by the next compaction."""
    from mncloud.storage import join_key

    blocks: dict[str, dict[str, None]] = {}
    for text in texts.values():
        for head, lines in _blocks(text):
            blocks.setdefault(head, {}).update(dict.fromkeys(lines))
    body = "".join(head + "\n" + "".join(f"{x}\n" for x in lines) for head, lines in blocks.items())
    digest = hashlib.sha256("\n".join(sorted(texts)).encode()).hexdigest()[:20]
    try:
        bucket.put_bytes(join_key(prefix, f"c-{digest}{SUFFIX}"), body.encode())
        for key in texts:
            if not key.endswith(f"c-{digest}{SUFFIX}"):
                bucket.delete(key)
    except Exception as err:  # a read never fails for want of compaction
        log.warning("telemetry segments not compacted: %s", err)
