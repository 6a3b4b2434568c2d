"""Checkpoint files streamed from DCP straight into S3 multipart uploads: no local copy.

`S3StreamFileSystem` is a DCP `FileSystem`: DCP's own `FileSystemWriter` serializes each shard
into a stream from `create_stream`, and that stream hashes (xxh3_128) the bytes as they pass,
cuts them into parts of the bucket's `chunk_size` and uploads each part as soon as it is full,
with `max_concurrency` parts in flight (the same part size and concurrency as
`S3Bucket.put_file`). The shard is uploaded while DCP is still writing it; the writer waits
only when every part buffer is in flight, so memory stays bounded (`PartBuffers`).

Files smaller than one part are sent in one PUT when closed; DCP's `.metadata.tmp` is held
in memory, whatever its size, until DCP renames it, then sent under its final name. Every
request is retried by the bucket (`RetryingBucket`); a part that still fails fails the save,
and its multipart upload is aborted. `finish()` waits for every upload and returns each
file's size and content hash.
"""

from __future__ import annotations

import contextlib
import io
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemBase

from mncloud.errors import StorageError
from mncloud.storage.checkpoints import FileEntry, hash_bytes
from mncloud.storage.chunks import SUFFIX, FileHasher, chunked
from mncloud.storage.s3 import S3Bucket


class PartBuffers:
    """Reusable part-sized buffers, at most `count`; `take` blocks while all are in use.

    Reused across saves, so a part is one copy into memory already mapped (no page faults)."""

    def __init__(self, size: int, count: int) -> None:
        self.size = size
        self.count = count
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._made = 0
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        """A free buffer (a new one while fewer than `count` exist)."""
        with self._lock:
            if self._free.empty() and self._made < self.count:
                self._made += 1
                return bytearray(self.size)
        return self._free.get()

    def give(self, buf: bytearray) -> None:
        """Return a buffer taken with `take`."""
        self._free.put(buf)


@dataclass
class _Upload:
    """One file on its way to the bucket."""

    key: str
    held: bytearray | None = None
    """All its bytes, kept in memory until it is renamed (DCP's `.tmp` files), else None."""
    upload_id: str | None = None
    parts: list[Future[str]] = field(default_factory=list)
    small: Future[None] | None = None


class _PartStream(io.RawIOBase):
    """A write-only binary stream that hashes its bytes (a shard file's chunks too) and hands
    full parts to `fs`."""

    def __init__(self, fs: S3StreamFileSystem, upload: _Upload, name: str) -> None:
        super().__init__()
        self._fs = fs
        self._upload = upload
        self.hasher = FileHasher(chunks=chunked(name))
        self._buf: bytearray | None = None
        self._fill = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        t0 = time.perf_counter()
        self.hasher.update(view)  # xxhash releases the GIL on large buffers
        self._fs.hash_s += time.perf_counter() - t0
        if self._upload.held is not None:
            self._upload.held += view
            self.size += len(view)
            return len(view)
        done = 0
        while done < len(view):
            if self._buf is None:
                self._buf = self._fs.take_buffer()
            take = min(len(view) - done, len(self._buf) - self._fill)
            with memoryview(self._buf) as into:  # a bytearray's own slice assignment would
                into[self._fill : self._fill + take] = view[done : done + take]  # copy twice
            self._fill += take
            done += take
            if self._fill == len(self._buf):
                self._fs.send_part(self._upload, self._buf)
                self._buf, self._fill = None, 0
        self.size += done
        return done

    def flush(self) -> None:
        """Nothing to flush: parts are sent when full, the rest by `finish`."""

    def finish(self) -> tuple[bytes, FileEntry]:
        """The bytes not sent yet (they give their buffer back) and the file's entry."""
        rest = bytes(memoryview(self._buf)[: self._fill]) if self._buf is not None else b""
        if self._buf is not None:
            self._fs.buffers.give(self._buf)
            self._buf = None
        return rest, FileEntry.of(self.size, self.hasher.hexdigest())

    def discard(self) -> None:
        """Give the buffer back without sending it."""
        if self._buf is not None:
            self._fs.buffers.give(self._buf)
            self._buf = None


class S3StreamFileSystem(FileSystemBase):
    """A DCP `FileSystem` whose files become objects `key_of(name)` in an S3 bucket.

    Use one per save: `writer.fs = S3StreamFileSystem(...)`, `dcp.save(...)`, then `finish()`
    (or `abort()` after a failure)."""

    def __init__(
        self, bucket: S3Bucket, key_of: Callable[[str], str], buffers: PartBuffers, *, workers: int
    ) -> None:
        super().__init__()
        self.bucket = bucket
        self.key_of = key_of
        self.buffers = buffers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mncloud-s3-part")
        self._uploads: dict[str, _Upload] = {}
        self._held: dict[str, bytes] = {}  # DCP's .tmp files, sent once renamed
        self.entries: dict[str, FileEntry] = {}
        self._failed: BaseException | None = None
        self.hash_s = 0.0
        """Seconds spent hashing, in all."""
        self.wait_s = 0.0
        """Seconds the writer waited for a free part buffer (the upload was the bottleneck)."""

    # ------------------------------------------------------------------ the parts
    def take_buffer(self) -> bytearray:
        """A part buffer (waits while every buffer is in flight); raises a part's failure."""
        if self._failed is not None:
            raise self._failed
        t0 = time.perf_counter()
        buf = self.buffers.take()
        self.wait_s += time.perf_counter() - t0
        if self._failed is not None:
            self.buffers.give(buf)
            raise self._failed
        return buf

    def send_part(self, upload: _Upload, buf: bytearray) -> None:
        """Upload a full buffer as the next part (the multipart upload starts with part 1)."""
        if upload.upload_id is None:
            upload.upload_id = self.bucket.start_multipart(upload.key)
        number = len(upload.parts) + 1
        upload.parts.append(self._pool.submit(self._part, upload, number, buf))

    def _part(self, upload: _Upload, number: int, body: bytes | bytearray) -> str:
        try:
            if self._failed is not None:  # another part failed: the save is lost anyway
                raise self._failed
            assert upload.upload_id is not None
            return self.bucket.put_part(upload.key, upload.upload_id, number, body)
        except BaseException as err:
            self._failed = self._failed or err
            raise
        finally:
            if isinstance(body, bytearray):
                self.buffers.give(body)

    def _close(self, name: str, stream: _PartStream) -> None:
        """A file is written: send what is left, or hold it until it is renamed; a shard file's
        chunk hashes follow it as its sidecar (`storage.chunks`)."""
        rest, entry = stream.finish()
        self.entries[name] = entry
        if chunked(name):
            self.put(name + SUFFIX, stream.hasher.sidecar())
        upload = self._uploads[name]
        if upload.upload_id is not None:
            if rest:
                number = len(upload.parts) + 1
                upload.parts.append(self._pool.submit(self._part, upload, number, rest))
        elif upload.held is not None:
            self._held[name] = bytes(upload.held)
        else:
            upload.small = self._pool.submit(self.bucket.put_bytes, upload.key, rest)

    def put(self, name: str, data: bytes) -> None:
        """Send a small file of the save that DCP does not write (hashed here)."""
        self._uploads[name] = upload = _Upload(self.key_of(name))
        self.entries[name] = FileEntry.of(len(data), hash_bytes(data))
        upload.small = self._pool.submit(self.bucket.put_bytes, upload.key, data)

    def finish(self) -> dict[str, FileEntry]:
        """Wait for every upload, complete the multipart ones; each file's entry."""
        try:
            for upload in self._uploads.values():
                if upload.small is not None:
                    upload.small.result()
                if upload.upload_id is not None:
                    etags = [part.result() for part in upload.parts]
                    self.bucket.finish_multipart(upload.key, upload.upload_id, etags)
                    upload.upload_id = None
        except BaseException:
            self.abort()
            raise
        self._pool.shutdown()
        return dict(self.entries)

    def abort(self) -> None:
        """Stop: wait for the parts in flight (queued ones fail fast once one failed, giving
        their buffers back), then abort the multipart uploads begun."""
        self._failed = self._failed or StorageError("checkpoint upload abandoned")
        self._pool.shutdown(wait=True)
        for upload in self._uploads.values():
            if upload.upload_id is not None:
                self.bucket.abort_multipart(upload.key, upload.upload_id)
                upload.upload_id = None

    # ------------------------------------------------------------------ DCP's FileSystem
    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            raise OSError(f"{path}: a streaming checkpoint is write-only")
        name = PurePosixPath(str(path)).name
        held = bytearray() if name.endswith(".tmp") else None  # renamed later: not sent yet
        self._uploads[name] = _Upload(self.key_of(name), held)
        stream = _PartStream(self, self._uploads[name], name)
        try:
            yield stream
        except BaseException:
            stream.discard()
            raise
        self._close(name, stream)

    def concat_path(self, path: Any, suffix: str) -> Any:
        return PurePosixPath(str(path)) / suffix

    def init_path(self, path: Any) -> Any:
        return PurePosixPath(str(path))

    def rename(self, path: Any, new_path: Any) -> None:
        old, new = PurePosixPath(str(path)).name, PurePosixPath(str(new_path)).name
        if old not in self._held:
            raise OSError(f"cannot rename {old}: only a held .tmp file can be")
        data = self._held.pop(old)
        self._uploads.pop(old)
        self.entries.pop(old)
        self.put(new, data)

    def mkdir(self, path: Any) -> None:
        """Nothing to make: keys need no folders."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    def exists(self, path: Any) -> bool:
        return PurePosixPath(str(path)).name in self._uploads

    def rm_file(self, path: Any) -> None:
        raise OSError(f"{path}: a streaming checkpoint never removes a file")
