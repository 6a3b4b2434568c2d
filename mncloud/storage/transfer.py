"""A `--ckpt-dir` unit's files moved at the storage's speed, each hashed as its bytes pass.

**Download** (`fetch`): every file is cut into `CHUNK` ranges; `WORKERS` threads read them with
`Bucket.get_range` (one ranged GET on S3 and GCS, a `pread` on a folder), across the files of
the unit at once, and write each in place (`os.pwrite`). A file's ranges are hashed (xxh3_128)
in their order as they arrive: a range that comes early waits in memory for the ones before it,
and a new range is asked for only while fewer than `WORKERS + WINDOW` are read or waiting, so
memory stays under `(WORKERS + WINDOW) × CHUNK` (256 MiB), whatever the sizes. No second pass.

    file A (40 MiB): ranges 0-16, 16-32, 32-40 MiB   ─┐  8 threads; A's range 16-32 done first:
    file B (3 KiB):  range 0-3 KiB                    ─┘  held until 0-16 is done and hashed

The first failure stops the rest. What the bucket holds wrong is `BadObject`, naming the file
and the range (a short read, an object gone meanwhile); a file whose bytes fail the hash its
marker gives is reported by the caller from the digests `fetch` returns. Anything else (the
bucket unreachable after its retries, the local disk) is raised as it is: not the unit's fault.

**Upload** (`put_stream`, S3): the file is read once, part by part (`PART`), from an open
descriptor; each part is hashed, then sent (`PARTS_IN_FLIGHT` at once, as a multipart upload),
so upload and hash are one pass and nothing is copied aside.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import xxhash

from mncloud.errors import StorageError
from mncloud.storage.buckets import Bucket, ObjectNotFoundError, ShortReadError
from mncloud.storage.s3 import S3Bucket

MiB = 1024 * 1024
CHUNK = 16 * MiB
"""Bytes of one ranged read."""
WORKERS = 8
"""Ranged reads in flight at once (on the suite's server, 16 took more CPU for no more speed)."""
WINDOW = 8
"""Ranges read ahead of the one a file's hash waits for, beyond `WORKERS`."""
PART = 8 * MiB
"""Bytes of one part of an upload (more for a file over 10,000 of them: S3's limit)."""
MAX_PARTS = 10_000
PARTS_IN_FLIGHT = 16
"""Parts of an upload sent at once."""


class BadObject(StorageError):
    """The bucket does not hold a file as its marker says: `rel` and the range are named."""

    def __init__(self, rel: str, why: str) -> None:
        super().__init__(f"{rel}: {why}")
        self.rel = rel


class Changed(StorageError):
    """A file being uploaded changed meanwhile (shorter than it was): upload it again later."""


@dataclass(frozen=True)
class Want:
    """One file to fetch: its key, where it goes, its size, and its name in messages."""

    key: str
    path: Path
    size: int
    rel: str


class _Sink:
    """One file being written: ranges land anywhere, the hash takes them in order."""

    def __init__(self, want: Want) -> None:
        self.want = want
        self.fd = os.open(want.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._hash = xxhash.xxh3_128()
        self._next = 0
        self._ready: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def put(self, start: int, data: bytes) -> int:
        """Write a range and hash what is now in order; return how many ranges were hashed."""
        view, at = memoryview(data), start
        while view:
            done = os.pwrite(self.fd, view, at)
            view, at = view[done:], at + done
        with self._lock:
            self._ready[start] = data
            hashed = 0
            while self._next in self._ready:
                block = self._ready.pop(self._next)
                self._hash.update(block)
                self._next += len(block)
                hashed += 1
            return hashed

    def digest(self) -> str:
        return str(self._hash.hexdigest())


def _bad(want: Want, start: int, length: int, err: Exception, url: str) -> BadObject:
    span = f"bytes {start}-{start + length - 1}"
    if isinstance(err, ShortReadError):
        return BadObject(want.rel, str(err).removeprefix(f"{url}/{want.key}: "))
    return BadObject(want.rel, f"missing from the bucket (read of {span})")


class _Fetch:
    """One `fetch`: the threads, the window, the first failure."""

    def __init__(self, bucket: Bucket, workers: int, chunk: int) -> None:
        self.bucket, self.chunk = bucket, chunk
        self.slots = threading.Semaphore(workers + WINDOW)
        self.failed: list[BaseException] = []
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="mncloud-fetch")

    def read(self, sink: _Sink, start: int, length: int) -> None:
        hashed = 1  # a range that is not read frees its own slot
        try:
            if self.failed:
                return
            try:
                data = self.bucket.get_range(sink.want.key, start, length)
            except (ShortReadError, ObjectNotFoundError) as err:
                raise _bad(sink.want, start, length, err, self.bucket.url) from err
            hashed = sink.put(start, data)
        except BaseException as err:
            self.failed.append(err)
        finally:
            for _ in range(hashed):
                self.slots.release()

    def submit(self, sink: _Sink, start: int, length: int) -> Future[None] | None:
        while not self.slots.acquire(timeout=0.1):
            if self.failed:
                return None
        return self.pool.submit(self.read, sink, start, length)


def fetch(
    bucket: Bucket, wants: list[Want], *, workers: int = WORKERS, chunk: int = CHUNK
) -> dict[str, str]:
    """Download every file of `wants` (ranges in parallel, see the module docstring); return
    each one's xxh3_128 by its `rel`. On a failure the files written so far are left for the
    caller to remove (it writes them into a folder of its own)."""
    job = _Fetch(bucket, workers, chunk)
    sinks: list[_Sink] = []
    futures: list[Future[None]] = []
    try:
        for want in wants:
            want.path.parent.mkdir(parents=True, exist_ok=True)
            sink = _Sink(want)
            sinks.append(sink)
            for start in range(0, want.size, chunk):
                future = job.submit(sink, start, min(chunk, want.size - start))
                if future is None:
                    break
                futures.append(future)
            if job.failed:
                break
        wait(futures)
    finally:
        job.pool.shutdown(wait=True)
        for sink in sinks:
            os.close(sink.fd)
    if job.failed:
        raise job.failed[0]
    return {sink.want.rel: sink.digest() for sink in sinks}


def streams(bucket: Bucket) -> TypeGuard[S3Bucket]:
    """Does `put_stream` serve this bucket (S3's multipart upload)?"""
    return isinstance(bucket, S3Bucket)


def _read(fd: int, length: int, at: int) -> bytes:
    data = os.pread(fd, length, at)
    while len(data) < length:
        more = os.pread(fd, length - len(data), at + len(data))
        if not more:
            raise Changed(f"the file ended at {at + len(data)} B of the {at + length} B read")
        data += more
    return data


def put_stream(
    bucket: S3Bucket, key: str, fd: int, size: int, *, workers: int = PARTS_IN_FLIGHT
) -> str:
    """Upload `size` bytes of the open file `fd` to `key`, hashed as they are read; return
    the xxh3_128. One PUT up to `PART`, else a multipart upload of `PART`-sized parts."""
    part = max(PART, -(-size // MAX_PARTS // MiB) * MiB)
    hasher = xxhash.xxh3_128()
    if size <= part:
        data = _read(fd, size, 0)
        hasher.update(data)
        bucket.put_bytes(key, data)
        return str(hasher.hexdigest())
    upload_id = bucket.start_multipart(key)
    slots = threading.Semaphore(workers)
    futures: list[Future[str]] = []
    release: Callable[[object], None] = lambda _f: slots.release()  # noqa: E731
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="mncloud-put") as pool:
            for number, at in enumerate(range(0, size, part), 1):
                body = _read(fd, min(part, size - at), at)
                hasher.update(body)
                slots.acquire()
                if any(f.done() and f.exception() for f in futures):
                    break
                future = pool.submit(bucket.put_part, key, upload_id, number, body)
                future.add_done_callback(release)
                futures.append(future)
        etags = [f.result() for f in futures]
        bucket.finish_multipart(key, upload_id, etags)
    except BaseException:
        with contextlib.suppress(Exception):
            bucket.abort_multipart(key, upload_id)
        raise
    return str(hasher.hexdigest())
