"""The `Bucket` interface and the local-directory bucket (`factory.open_bucket` opens any).

`open_bucket("s3://team-ckpt/run-1")` returns the bucket and the key prefix inside it. Keys are
plain `str` with `/` separators, so the same code serves `s3://` (`s3.py`), `gs://` (`gcs.py`)
and `file://` (`LocalBucket`, here). Every operation retries transient failures for up to
`retry_seconds` (see `retry.py`), then raises `StorageError`; a missing key raises
`ObjectNotFoundError`. Credentials are never logged: messages carry only bucket, key and the
server's error code.

A local directory bucket writes to a temporary file first and renames it into place, so a
reader never sees half a file. Its outage can be simulated, where `chmod` does not stop root:
while `<root>/.mncloud-outage` exists, every operation fails as if the server were down
(`set_simulated_outage`). For S3, the test fixtures stop and restart the server itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from mncloud.constants import STORAGE_OUTAGE_MARKER
from mncloud.errors import StorageError
from mncloud.storage.retry import (
    DEFAULT_RETRY_SECONDS,
    TransientStorageError,
    call_with_retry,
    short_error,
)
from mncloud.storage.url import BucketURL, BucketURLError

T = TypeVar("T")


class ObjectNotFoundError(StorageError):
    """The key does not exist in the bucket."""


class ShortReadError(StorageError):
    """A ranged read returned fewer bytes than asked for (the object is shorter than the
    manifest says, or was replaced meanwhile). Not retried: the same object reads the same."""


def checked_range(url: str, key: str, start: int, length: int, data: bytes) -> bytes:
    """`data` when it is `length` bytes long; ShortReadError naming the range otherwise."""
    check_length(url, key, start, length, len(data))
    return data


def check_length(url: str, key: str, start: int, length: int, got: int) -> None:
    """ShortReadError naming the range when `got` bytes of `length` came."""
    if got != length:
        raise ShortReadError(
            f"{url}/{key}: bytes {start}-{start + length - 1} returned {got} of {length}"
        )


@dataclass(frozen=True)
class ObjectInfo:
    """One object in a listing."""

    key: str
    """Full key inside the bucket."""
    size: int
    """Size in bytes."""
    mtime: float
    """Last modification, seconds since the epoch."""


@runtime_checkable
class Bucket(Protocol):
    """The operations mncloud needs from object storage. Keys are `/`-separated strings."""

    url: str
    """The bucket's URL without a prefix, e.g. `s3://team-ckpt`."""

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None: ...
    def get_file(self, key: str, path: str | os.PathLike[str]) -> None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, length: int) -> bytes: ...
    def read_range_into(self, key: str, start: int, out: memoryview) -> None: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...


def delete_prefix(bucket: Bucket, prefix: str) -> int:
    """Delete every object under `prefix/`; return how many were deleted."""
    objs = bucket.list(prefix.rstrip("/") + "/")
    for obj in objs:
        bucket.delete(obj.key)
    return len(objs)


def set_simulated_outage(uri: str, down: bool) -> None:
    """Start or end a simulated outage of a `file://` bucket (see the module docstring)."""
    url = BucketURL.parse(uri, check_name=False)
    if url.scheme != "file":
        raise BucketURLError(f"a simulated outage works only for file:// buckets, not {uri!r}")
    marker = Path(url.name) / STORAGE_OUTAGE_MARKER
    if down:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary file beside `path`, renamed onto it when the block succeeds.

    A reader never sees half a file; on failure the temporary file is removed.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write a whole file so that readers see the old or the new content, never a mix."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


class RetryingBucket:
    """What every bucket's operations share: `_call` runs one with `call_with_retry`.

    A subclass sets `url` and `retry_seconds` and gives `_classify` (see `retry.Classify`) and
    `_is_not_found` (does this SDK error say the object is missing?); `_before_op` may refuse
    an attempt before it starts.
    """

    url: str
    retry_seconds: float

    def _classify(self, err: BaseException) -> str | None:
        raise NotImplementedError

    def _is_not_found(self, err: Exception) -> bool:
        raise NotImplementedError

    def _before_op(self) -> None:
        """Called before every attempt (LocalBucket's simulated outage)."""

    def _call(self, what: str, op: Callable[[], T], key: str | None = None) -> T:
        """Run `op` with retries; with a `key`, a not-found error is `ObjectNotFoundError`
        (without one, e.g. for a listing, it is classified like any other error)."""

        def guarded() -> T:
            self._before_op()
            try:
                return op()
            except Exception as err:
                if key is not None and self._is_not_found(err):
                    raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from err
                raise

        return call_with_retry(
            guarded,
            what=f"{what} {self.url}/{key or ''}",
            classify=self._classify,
            budget=self.retry_seconds,
        )


def _may_match(folder: str, prefix: str) -> bool:
    """Whether keys under `folder` (ending in "/") may start with `prefix`."""
    return folder.startswith(prefix) or prefix.startswith(folder)


class LocalBucket(RetryingBucket):
    """A directory that behaves like a bucket; writes are atomic (temporary file + rename)."""

    def __init__(
        self, root: str | os.PathLike[str], *, retry_seconds: float = DEFAULT_RETRY_SECONDS
    ) -> None:
        self.root = Path(root)
        self.url = f"file://{self.root}"
        self.retry_seconds = retry_seconds

    def _path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise StorageError(f"invalid key {key!r}")
        return self.root.joinpath(*parts)

    @staticmethod
    def _classify(err: BaseException) -> str | None:
        if isinstance(err, (IsADirectoryError, NotADirectoryError)):
            return short_error(err)
        if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.ENAMETOOLONG):
            return short_error(err)
        return None  # EACCES, EIO, ENOSPC, a vanished mount: may pass

    def _before_op(self) -> None:
        if (self.root / STORAGE_OUTAGE_MARKER).exists():
            raise TransientStorageError(f"{self.url} is unavailable (simulated outage)")

    def _is_not_found(self, err: Exception) -> bool:
        return isinstance(err, FileNotFoundError)

    def _copy_in(self, key: str, write: Callable[[Path], None]) -> None:
        with atomic_path(self._path(key)) as tmp:
            write(tmp)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy a file in."""
        src = Path(path)
        if not src.is_file():
            raise StorageError(f"upload to {self.url}/{key}: no such file {src}")
        self._call("upload to", lambda: self._copy_in(key, lambda t: shutil.copyfile(src, t)), None)

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Copy a file out (atomically)."""

        def op() -> None:
            src = self._path(key)
            with atomic_path(path) as tmp:
                shutil.copyfile(src, tmp)

        self._call("download of", op, key)

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write a small object."""
        self._call("write of", lambda: self._copy_in(key, lambda t: t.write_bytes(data)), None)

    def get_bytes(self, key: str) -> bytes:
        """Read a whole object."""
        return self._call("read of", lambda: self._path(key).read_bytes(), key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read `length` bytes from offset `start` (a direct read: no copy of the rest)."""

        def op() -> bytes:
            with open(self._path(key), "rb") as f:
                return os.pread(f.fileno(), length, start) if length else b""

        return checked_range(self.url, key, start, length, self._call("read of", op, key))

    def read_range_into(self, key: str, start: int, out: memoryview) -> None:
        """Read `len(out)` bytes from offset `start` straight into `out`."""

        def op() -> int:
            got = 0
            with open(self._path(key), "rb") as f:
                while got < len(out) and (n := os.preadv(f.fileno(), [out[got:]], start + got)):
                    got += n
            return got

        check_length(self.url, key, start, len(out), self._call("read of", op, key))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key (temporary files hidden)."""
        return self._call("listing of", lambda: self._walk(prefix), None)

    def _walk(self, prefix: str) -> list[ObjectInfo]:
        # Walk only the deepest directory the prefix names in full.
        base = self.root.joinpath(*[p for p in prefix.split("/")[:-1] if p])
        if not base.is_dir():
            return []
        out = []
        for dirpath, dirs, files in os.walk(base):
            # Only into folders that may hold a match (a checkpoint listing, `step_`, never
            # walks a run's thousands of telemetry segments).
            at = Path(dirpath).relative_to(self.root).as_posix()
            here = "" if at == "." else f"{at}/"
            dirs[:] = [d for d in dirs if _may_match(f"{here}{d}/", prefix)]
            for f in files:
                key = here + f  # a string test first: a folder may hold thousands
                if f.endswith(".part") or f == STORAGE_OUTAGE_MARKER or not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, f))
                except FileNotFoundError:
                    continue
                out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        """Delete one object (and directories left empty); a missing key is not an error."""

        def op() -> None:
            path = self._path(key)
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self.root and parent.is_relative_to(self.root):
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

        self._call("delete of", op, None)

    def exists(self, key: str) -> bool:
        """Whether the object exists."""
        return self._call("stat of", lambda: self._path(key).is_file(), None)

    def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFoundError if missing."""
        return self._call("stat of", lambda: self._path(key).stat().st_size, key)
