"""Training telemetry through the bucket: ranks append JSONL segments and keep rollups of them.

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
replacement. Each writer also keeps its process's rollup (`telemetry.rollup`: step rows and
metric points thinned to a bounded number, exact step-time windows, events), written as
`rollup/r00003-<launch>.json` before its first segment and after it, after every
`ROLLUP_EVERY` and at its end: `ROLLUP_EVERY` + 1 objects per rank where it wrote
`ROLLUP_EVERY` before.

`read_summary` is what `status`, `metrics`, goodput and the web view read: the rollups and the
segments written since each (bounded by ranks × launches, not by the run's length), or every
segment for a series written before rollups. `read_series` reads every segment (`metrics
--raw`, the local backend's recovery figures), skips a torn or malformed one (counted in
`Series.skipped`) and merges them into one `Series`: steps with their times per rank and
launch, the metrics over steps, the events, and each launch's first step. A live reader
polls with `SeriesTail` (`telemetry.seriestail`), which fetches only the segments it has not
read. Training never waits on it: a record is a list append; the bucket is written off the
training thread and its errors logged.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from mncloud import constants, layout
from mncloud.telemetry.rollup import ROLLUP_DIR, ROLLUP_EVERY, Rollup, read_rollups, rollup_name
from mncloud.telemetry.segments import (
    SUFFIX,
    EventRow,
    Launch,
    Point,
    Series,
    StepRow,
    blocks,
    merged,
    parse,
    segment_name,
)

__all__ = [
    "SUFFIX", "EventRow", "Launch", "Point", "Series", "SeriesWriter", "StepRow",
    "finite_metrics", "read_series", "read_summary", "reads_shared", "writer_from_env",
]  # fmt: skip

log = logging.getLogger(__name__)

#: Seconds between a rank's segment writes (objects per rank per hour = 3600 / this at most).
FLUSH_INTERVAL_S = 30.0
#: Records a rank keeps buffered at most (older ones are dropped if the bucket is down).
MAX_BUFFER = 200_000
#: A compacting read merges the segments into one once there are at least this many.
COMPACT_AT = 16
#: Reads of the segments give up after this long.
READ_RETRY_SECONDS = 5.0


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
        rollup: bool = True,
        launch: str | None = None,
    ) -> None:
        self.uri, self.rank, self.node, self.interval = uri, rank, node, interval
        self.t0 = _process_start()
        self.launch = launch or f"{int(self.t0 * 1000):x}-{os.getpid():x}"
        """This process's tag: its start time and pid (`launch` names another, in tests)."""
        self.segments = 0
        self.rollup = Rollup(rank, self.launch, node) if rollup else None
        """This process's rollup (`telemetry.rollup`); None writes segments only (as a writer
        before rollups did)."""
        self._rolled = -1
        """Segments the rollup in the bucket covers (-1: none written yet)."""
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
        try:
            if self._rolled < 0 and self.rollup is not None:  # no segment without a rollup
                self._put(rollup_name(self.rank, self.launch), self.rollup.to_json())
                self._rolled = 0
            self._put(segment_name(self.rank, self.launch, self.segments), body.encode())
        except Exception as err:  # telemetry must never break training
            log.warning("telemetry segment not written (kept for the next try): %s", err)
            with self._lock:
                self._buffer[:0] = records
            return False
        self.segments += 1
        if self.rollup is not None:
            try:
                self.rollup.take(body)
            except Exception as err:  # never: but then readers read every segment
                self.rollup.irregular = f"not folded: {type(err).__name__}"
            if self.segments - self._rolled >= ROLLUP_EVERY or self._rolled == 0:
                self.write_rollup()
        return True

    def write_rollup(self) -> None:
        """Write the rollup if it is behind the segments (best effort: a reader folds the
        segments it does not cover)."""
        if self.rollup is None or self._rolled == self.segments:
            return
        try:
            self._put(rollup_name(self.rank, self.launch), self.rollup.to_json())
            self._rolled = self.segments
        except Exception as err:
            log.warning("telemetry rollup not written: %s", err)

    def _open(self) -> tuple[Any, str]:
        """The bucket and key prefix, opened once (its S3 client is the process's)."""
        if self._bucket is None:
            from mncloud.storage import open_bucket

            self._bucket = open_bucket(self.uri, retry_seconds=2.0)
        return self._bucket

    def _put(self, name: str, data: bytes) -> None:
        from mncloud.storage import join_key

        bucket, prefix = self._open()
        bucket.put_bytes(join_key(prefix, name), data)

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
            self.write_rollup()

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()
        self.flush()
        self.write_rollup()


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


_shared: ContextVar[dict[str, tuple[Series, bool]] | None] = ContextVar(
    "mncloud_series", default=None
)


@contextlib.contextmanager
def reads_shared() -> Iterator[None]:
    """In the block, `read_summary` reads each series once (a command that asks twice for
    it: `status`'s stragglers, then its goodput; a run's page)."""
    token = _shared.set({})
    try:
        yield
    finally:
        _shared.reset(token)


def read_summary(uri: str, *, metrics: bool = True) -> Series:
    """What `status`, `metrics`, goodput and the web view read of a series: its rollups and
    the segments written since each (`telemetry.rollup`: rows and points thinned, each rank's
    step-time windows exact; no metric points without `metrics`), or every segment when it
    has no rollups or they cannot stand for it (a series written before rollups, a rank
    whose steps went back). Inside `reads_shared`, a series is read once."""
    shared = _shared.get()
    seen = None if shared is None else shared.get(uri)
    if seen is not None and (seen[1] or not metrics):
        return seen[0]
    found, _fetched = read_rollups(uri, READ_RETRY_SECONDS, metrics=metrics)
    whole = found is None
    if found is None:
        found = read_series(uri, compact=True)
    if shared is not None:
        shared[uri] = (found, metrics or whole)
    return found


def read_series(uri: str, *, compact: bool = False) -> Series:
    """Every segment under a series URI (`layout.series_uri`), merged (module docstring).

    With `compact`, once `COMPACT_AT` readable segments are there they are written again as
    one (`_compact`) and removed, so later reads list and fetch one object where there were
    many; never in a series with rollups (their readers fold the segments after the ones
    each covers: they must stay). A segment removed by another reader's compaction between
    the listing and its fetch makes the read start over (its content is in that reader's
    compacted segment)."""
    from mncloud.storage import ObjectNotFoundError, open_bucket

    bucket, prefix = open_bucket(uri, retry_seconds=READ_RETRY_SECONDS)
    rolled = f"{prefix}/{ROLLUP_DIR}/" if prefix else f"{ROLLUP_DIR}/"
    for attempt in range(3):
        series, texts = Series(), dict[str, str]()
        try:
            for obj in bucket.list(f"{prefix}/" if prefix else ""):
                compact = compact and not obj.key.startswith(rolled)
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
            parse(text, series)
            good[key] = text
        except (ValueError, KeyError, TypeError, ArithmeticError) as err:
            log.warning("telemetry segment %s skipped: %s", key, err)
            series.skipped += 1
    series.steps = merged(series.steps)
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

    heads: dict[str, dict[str, None]] = {}
    for text in texts.values():
        for head, lines in blocks(text):
            heads.setdefault(head, {}).update(dict.fromkeys(lines))
    body = "".join(head + "\n" + "".join(f"{x}\n" for x in lines) for head, lines in heads.items())
    digest = hashlib.sha256("\n".join(sorted(texts)).encode()).hexdigest()[:20]
    try:
        bucket.put_bytes(join_key(prefix, f"c-{digest}{SUFFIX}"), body.encode())
        for key in texts:
            if not key.endswith(f"c-{digest}{SUFFIX}"):
                bucket.delete(key)
    except Exception as err:  # a read never fails for want of compaction
        log.warning("telemetry segments not compacted: %s", err)
