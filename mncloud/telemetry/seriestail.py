"""A live run's telemetry segments read as they come (`telemetry.series`), for pollers.

`read_series` fetches every segment on each call: fine for `status`, too slow for the local
supervisor, which asks every 0.1 s for a launch's first step and for node recovery's replica
news. A `SeriesTail` lists the series and fetches only the segments it has not read; each
`read` returns what they add as a `Series` of its own (steps as written, not merged). A
segment compacted by another reader (`c-….jsonl`) holds records already read: per launch tag
only records newer than the newest one read are taken. A torn or malformed segment is
skipped for good and counted (`skipped`). A directory bucket (a local run's `file://` one,
thousands of segments after a few minutes) is listed by one read of its folder, without a
`stat` per object. Example, one rank writing a segment a second:

    tail = SeriesTail(uri)
    tail.read()    # r00000-<launch>-00000: steps 1-3 and the `start` event
    tail.read()    # nothing new: one listing, no fetch
    tail.read()    # r00000-<launch>-00001: steps 4-9
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mncloud.telemetry.segments import SUFFIX, Series, parse

log = logging.getLogger(__name__)

#: How long a tail's reads retry the bucket.
RETRY_SECONDS = 2.0


class SeriesTail:
    """The segments of one series URI not read yet (module docstring)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.skipped = 0
        self._seen: set[str] = set()
        self._newest: dict[str, float] = {}
        self._bucket: Any = None
        self._prefix = ""

    def read(self) -> Series:
        """The records of the segments written since the last call (empty when none, or when
        the bucket cannot be read now: they come with a later call)."""
        from mncloud.storage import ObjectNotFoundError

        out = Series()
        for key in self._new_keys():
            try:
                text = self._bucket.get_bytes(key).decode(errors="replace")
            except ObjectNotFoundError:  # compacted away meanwhile: its records come again
                self._seen.add(key)
                continue
            except Exception as err:
                log.debug("telemetry segment %s not read yet: %s", key, err)
                continue
            self._seen.add(key)
            self._take(key, text, out)
        out.steps.sort(key=lambda r: (r.t, r.rank))
        out.events.sort(key=lambda e: e.t)
        return out

    def skip(self) -> None:
        """Leave the segments written so far unread (a poller that wants only what comes
        next; a compaction may still bring back older records, which it filters by time)."""
        self._seen.update(self._new_keys())

    def _new_keys(self) -> list[str]:
        """The keys of the segments not read yet, sorted ([] when the bucket cannot be listed)."""
        from mncloud.storage import open_bucket
        from mncloud.storage.buckets import LocalBucket

        try:
            if self._bucket is None:
                self._bucket, self._prefix = open_bucket(self.uri, retry_seconds=RETRY_SECONDS)
            if isinstance(self._bucket, LocalBucket):
                folder = self._bucket.root.joinpath(*[p for p in self._prefix.split("/") if p])
                base = f"{self._prefix.strip('/')}/" if self._prefix.strip("/") else ""
                try:
                    names = os.listdir(folder)
                except FileNotFoundError:
                    names = []
                keys = [base + n for n in names if base + n not in self._seen]
            else:
                listed = self._bucket.list(f"{self._prefix}/" if self._prefix else "")
                keys = [obj.key for obj in listed if obj.key not in self._seen]
        except Exception as err:  # a poller tries again
            log.debug("telemetry not listed at %s: %s", self.uri, err)
            return []
        return sorted(k for k in keys if k.endswith(SUFFIX) and "/." not in f"/{k}")

    def _take(self, key: str, text: str, out: Series) -> None:
        """Add one segment's records that are newer than those read before to `out`."""
        part = Series()
        try:
            parse(text, part)
        except (ValueError, KeyError, TypeError, ArithmeticError) as err:
            log.warning("telemetry segment %s skipped: %s", key, err)
            self.skipped += 1
            return
        newest = dict(self._newest)
        for rows in (part.steps, part.events):
            for row in rows:
                if row.t > self._newest.get(row.launch, float("-inf")):
                    newest[row.launch] = max(newest.get(row.launch, row.t), row.t)
        out.steps += [r for r in part.steps if r.t > self._newest.get(r.launch, float("-inf"))]
        out.events += [e for e in part.events if e.t > self._newest.get(e.launch, float("-inf"))]
        for name, points in part.metrics.items():
            fresh = [p for p in points if p.t > self._newest.get(p.launch, float("-inf"))]
            out.metrics.setdefault(name, []).extend(fresh)
        for launch, t0 in part.starts.items():
            out.starts.setdefault(launch, t0)
        out.segments += 1
        self._newest = newest
