"""Buckets: one small interface over S3, GCS and a local directory.

`open_bucket("s3://team-ckpt/run-1")` returns the bucket and the key prefix inside it. Keys are
plain `str` with `/` separators, so the same code serves `s3://`, `gs://` and `file://`.

- S3 through boto3: multipart uploads with tuned concurrency; `AWS_ENDPOINT_URL` (or
  `endpoint_url=`) points it at any S3-compatible server. Default credential chain only.
- GCS through google-cloud-storage: resumable uploads; `STORAGE_EMULATOR_HOST` is honoured (then
  anonymous credentials are used, as the emulators expect).
- A local directory (`file:///path` or a bare path): writes go to a temporary file first and are
  renamed into place, so a reader never sees half a file.

Every operation retries transient failures (connection refused or reset, timeouts, 5xx,
throttling) with exponential backoff for up to `retry_seconds` (default 60 s, or
`MNCLOUD_STORAGE_RETRY_SECONDS`), then raises `StorageError`. Permanent failures (no such bucket,
access denied, no credentials) raise `StorageError` at once. A missing key raises
`ObjectNotFoundError`. Credentials are never logged: messages carry only bucket, key and the
server's error code.

A storage outage can be simulated for `file://` buckets, where `chmod` does not stop root: while
the file `<root>/.mncloud-outage` exists, every operation fails as if the server were down
(`set_simulated_outage`). For S3, the test fixtures stop and restart the server itself.

boto3 and google-cloud-storage are imported inside the functions that need them, so importing
this module (and starting the CLI) stays fast.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from mncloud.constants import STORAGE_OUTAGE_MARKER, STORAGE_RETRY_SECONDS_ENV
from mncloud.errors import StorageError

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RETRY_SECONDS = 60.0
MiB = 1024 * 1024
SCHEMES = ("s3", "gs", "file")


class ObjectNotFoundError(StorageError):
    """The key does not exist in the bucket."""


class TransientStorageError(StorageError):
    """A failure worth retrying (server down, timeout, throttling)."""


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
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...


# --------------------------------------------------------------------------- URLs and helpers


def split_uri(uri: str) -> tuple[str, str, str]:
    """Split `s3://name/a/b` → `("s3", "name", "a/b")`; `file:///x` → `("file", "/x", "")`.

    A bare path counts as `file://`. Raises StorageError on an unknown scheme or missing name.
    """
    if "://" not in uri:
        if not uri:
            raise StorageError("empty bucket URL; use s3://NAME[/PREFIX], gs://NAME or file:///DIR")
        return "file", str(Path(uri).expanduser().resolve()), ""
    scheme, rest = uri.split("://", 1)
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise StorageError(
            f"unsupported bucket URL scheme {scheme!r} in {uri!r}; use s3://, gs:// or file://"
        )
    if scheme == "file":
        if not rest:
            raise StorageError(f"no directory in {uri!r}; use file:///absolute/dir")
        return "file", str(Path(rest).expanduser().resolve()), ""
    name, _, prefix = rest.partition("/")
    if not name:
        raise StorageError(f"no bucket name in {uri!r}; use {scheme}://NAME[/PREFIX]")
    return scheme, name, prefix.strip("/")


def join_key(*parts: str) -> str:
    """Join key parts with single `/`, dropping empty parts."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def retry_seconds_from_env(default: float = DEFAULT_RETRY_SECONDS) -> float:
    """The retry budget from `MNCLOUD_STORAGE_RETRY_SECONDS`, else `default`."""
    raw = os.environ.get(STORAGE_RETRY_SECONDS_ENV)
    if not raw:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise StorageError(f"{STORAGE_RETRY_SECONDS_ENV}={raw!r} is not a number") from None


def open_bucket(uri: str, *, retry_seconds: float | None = None) -> tuple[Bucket, str]:
    """Open the bucket a URL names; return it and the key prefix inside it (no slashes at ends)."""
    scheme, name, prefix = split_uri(uri)
    budget = retry_seconds_from_env() if retry_seconds is None else retry_seconds
    if scheme == "s3":
        return S3Bucket(name, retry_seconds=budget), prefix
    if scheme == "gs":
        return GCSBucket(name, retry_seconds=budget), prefix
    return LocalBucket(name, retry_seconds=budget), prefix


def delete_prefix(bucket: Bucket, prefix: str) -> int:
    """Delete every object under `prefix/`; return how many were deleted."""
    objs = bucket.list(prefix.rstrip("/") + "/")
    for obj in objs:
        bucket.delete(obj.key)
    return len(objs)


def set_simulated_outage(uri: str, down: bool) -> None:
    """Start or end a simulated outage of a `file://` bucket (see the module docstring)."""
    scheme, root, _ = split_uri(uri)
    if scheme != "file":
        raise StorageError(f"a simulated outage works only for file:// buckets, not {uri!r}")
    marker = Path(root) / STORAGE_OUTAGE_MARKER
    if down:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def _retry(
    op: Callable[[], T],
    *,
    what: str,
    classify: Callable[[BaseException], str | None],
    budget: float,
) -> T:
    """Run `op`, retrying transient failures with exponential backoff for up to `budget` s.

    `classify(err)` returns None for a transient error (retry) or a message for a permanent one
    (raise StorageError with it). ObjectNotFoundError and StorageError raised by `op` pass through.
    """
    deadline = time.monotonic() + budget
    delay = 0.25
    attempt = 0
    while True:
        attempt += 1
        try:
            return op()
        except TransientStorageError as err:
            transient_msg = str(err)
        except StorageError:
            raise
        except Exception as err:  # classified below; the SDKs raise many unrelated types
            permanent = classify(err)
            if permanent is not None:
                raise StorageError(f"{what}: {permanent}") from err
            transient_msg = _short(err)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StorageError(
                f"{what}: still failing after {attempt} attempts over {budget:.0f}s "
                f"({transient_msg}); is the storage endpoint reachable?"
            )
        sleep = min(delay * (0.5 + _SDK_RANDOM.random()), remaining, 8.0)
        log.warning("%s failed (%s); retrying in %.1fs", what, transient_msg, sleep)
        time.sleep(sleep)
        delay = min(delay * 2, 8.0)


# The SDKs draw from the global `random` (multipart boundaries, temp names, retry jitter) in
# upload threads, at moments that depend on timing. That would perturb a training script's own
# python RNG stream and break bitwise-exact resume, so their module-level `random` is pointed
# at a private generator.
_SDK_RANDOM = random.Random()
_SDK_MODULES = {
    "s3": ("s3transfer", "s3transfer.utils", "botocore.retries.standard", "botocore.retryhandler",
           "botocore.utils", "urllib3.util.retry"),
    "gs": ("google.resumable_media._upload", "google.resumable_media._helpers",
           "google.cloud.storage._media._upload", "google.cloud.storage._media._helpers",
           "google.api_core.retry.retry_base", "google.auth._exponential_backoff",
           "urllib3.util.retry"),
}  # fmt: skip


def _isolate_sdk_random(kind: str) -> None:
    import importlib

    for name in _SDK_MODULES[kind]:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "random", None) is random:
            module.random = _SDK_RANDOM  # type: ignore[attr-defined]


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


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


# --------------------------------------------------------------------------- S3

_S3_TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestTimeTooSkewed",
    "OperationAborted",
    "500",
    "502",
    "503",
    "504",
}
_S3_DENIED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "403",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


class S3Bucket:
    """An S3 (or S3-compatible) bucket through boto3."""

    def __init__(
        self,
        name: str,
        *,
        endpoint_url: str | None = None,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        max_concurrency: int = 8,
        chunk_size: int = 16 * MiB,
    ) -> None:
        self.name = name
        self.url = f"s3://{name}"
        self.retry_seconds = retry_seconds
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.max_concurrency = max_concurrency
        self.chunk_size = chunk_size
        self._client: Any = None
        self._transfer: Any = None

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use; thread-safe)."""
        if self._client is None:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config

            _isolate_sdk_random("s3")
            config = Config(
                retries={"mode": "standard", "max_attempts": 3},
                max_pool_connections=max(10, 2 * self.max_concurrency),
                connect_timeout=5,
                read_timeout=60,
                s3={"addressing_style": "path"} if self.endpoint_url else {},
            )
            session = boto3.session.Session()
            region = session.region_name or "us-east-1"
            self._client = session.client(
                "s3", endpoint_url=self.endpoint_url, region_name=region, config=config
            )
            self._transfer = TransferConfig(
                multipart_threshold=self.chunk_size,
                multipart_chunksize=self.chunk_size,
                max_concurrency=self.max_concurrency,
                use_threads=True,
            )
        return self._client

    def _classify(self, err: BaseException) -> str | None:
        from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

        for e in _chain(err):
            if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
                return (
                    "no AWS credentials found (default chain: AWS_ACCESS_KEY_ID/"
                    "AWS_SECRET_ACCESS_KEY, ~/.aws, instance role)"
                )
            if isinstance(e, ClientError):
                code = str(e.response.get("Error", {}).get("Code", ""))
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
                if code in _S3_TRANSIENT_CODES or status >= 500 or status == 429:
                    return None
                if code in ("NoSuchBucket",):
                    return f"bucket {self.url} does not exist{self._where()}"
                if code in _S3_DENIED_CODES:
                    return f"access denied to {self.url} ({code}); check the credentials"
                return f"{code or status}: {e.response.get('Error', {}).get('Message', '')}"
        return None  # connection errors, timeouts and the like: transient

    def _where(self) -> str:
        return f" at {self.endpoint_url}" if self.endpoint_url else ""

    def _call(self, what: str, op: Callable[[], T], key: str | None = None) -> T:
        from botocore.exceptions import ClientError

        def guarded() -> T:
            try:
                return op()
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                if key is not None and code in ("NoSuchKey", "404", "NotFound"):
                    raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from err
                raise

        return _retry(
            guarded,
            what=f"{what} {self.url}/{key or ''}",
            classify=self._classify,
            budget=self.retry_seconds,
        )

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a file (multipart above `chunk_size`, `max_concurrency` parts in flight)."""
        client = self.client
        self._call(
            "upload to",
            lambda: client.upload_file(str(path), self.name, key, Config=self._transfer),
            key,
        )

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Download to `path` (atomically: a temporary file renamed into place)."""
        client = self.client

        def op() -> None:
            with atomic_path(path) as tmp:
                client.download_file(self.name, key, str(tmp), Config=self._transfer)

        self._call("download of", op, key)

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write a small object in one request."""
        client = self.client
        self._call("write of", lambda: client.put_object(Bucket=self.name, Key=key, Body=data), key)

    def get_bytes(self, key: str) -> bytes:
        """Read a whole object."""
        client = self.client
        return self._call(
            "read of", lambda: client.get_object(Bucket=self.name, Key=key)["Body"].read(), key
        )

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""
        client = self.client

        def op() -> list[ObjectInfo]:
            out = []
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=prefix
            ):
                for o in page.get("Contents", []):
                    out.append(ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp()))
            return sorted(out, key=lambda o: o.key)

        return self._call("listing of", op, None)

    def delete(self, key: str) -> None:
        """Delete one object; a missing key is not an error."""
        client = self.client
        self._call("delete of", lambda: client.delete_object(Bucket=self.name, Key=key), None)

    def exists(self, key: str) -> bool:
        """Whether the object exists."""
        try:
            self.size(key)
        except ObjectNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFoundError if missing."""
        client = self.client
        head = self._call("stat of", lambda: client.head_object(Bucket=self.name, Key=key), key)
        return int(head["ContentLength"])


# --------------------------------------------------------------------------- GCS


class GCSBucket:
    """A Google Cloud Storage bucket through google-cloud-storage."""

    def __init__(
        self,
        name: str,
        *,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        chunk_size: int = 32 * MiB,
    ) -> None:
        self.name = name
        self.url = f"gs://{name}"
        self.retry_seconds = retry_seconds
        self.chunk_size = chunk_size
        self._bucket: Any = None

    @property
    def bucket(self) -> Any:
        """The google.cloud.storage Bucket (created on first use)."""
        if self._bucket is None:
            from google.cloud import storage

            _isolate_sdk_random("gs")
            if os.environ.get("STORAGE_EMULATOR_HOST"):
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(
                    project=os.environ.get("GOOGLE_CLOUD_PROJECT", "mncloud-emulator"),
                    credentials=AnonymousCredentials(),
                )
            else:
                try:
                    client = storage.Client()
                except Exception as err:
                    raise StorageError(
                        f"no Google credentials for {self.url} ({type(err).__name__}); run "
                        "`gcloud auth application-default login` or set "
                        "GOOGLE_APPLICATION_CREDENTIALS"
                    ) from err
            self._bucket = client.bucket(self.name)
        return self._bucket

    def _classify(self, err: BaseException) -> str | None:
        from google.api_core import exceptions as gexc

        for e in _chain(err):
            if isinstance(e, (gexc.TooManyRequests, gexc.ServerError)):
                return None
            if isinstance(e, gexc.NotFound):
                return f"bucket {self.url} does not exist"
            if isinstance(e, (gexc.Forbidden, gexc.Unauthorized)):
                return f"access denied to {self.url}; check the credentials"
            if isinstance(e, gexc.GoogleAPICallError):
                return f"{e.code}: {e.message}"
            status = getattr(getattr(e, "response", None), "status_code", None)
            if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
                return f"HTTP {status}"
        return None

    def _call(self, what: str, op: Callable[[], T], key: str | None = None) -> T:
        from google.api_core import exceptions as gexc

        def guarded() -> T:
            try:
                return op()
            except gexc.NotFound as err:
                if key is not None and "bucket" not in str(err).lower():
                    raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from err
                raise

        return _retry(
            guarded,
            what=f"{what} {self.url}/{key or ''}",
            classify=self._classify,
            budget=self.retry_seconds,
        )

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a file (resumable, in `chunk_size` pieces, above 8 MiB)."""
        bucket = self.bucket
        size = os.path.getsize(path)
        chunk = self.chunk_size if size > 8 * MiB else None
        self._call(
            "upload to",
            lambda: bucket.blob(key, chunk_size=chunk).upload_from_filename(str(path)),
            key,
        )

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Download to `path` (atomically)."""
        bucket = self.bucket

        def op() -> None:
            with atomic_path(path) as tmp:
                bucket.blob(key).download_to_filename(str(tmp))

        self._call("download of", op, key)

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write a small object in one request."""
        bucket = self.bucket
        self._call("write of", lambda: bucket.blob(key).upload_from_string(data), key)

    def get_bytes(self, key: str) -> bytes:
        """Read a whole object."""
        bucket = self.bucket
        return self._call("read of", lambda: bucket.blob(key).download_as_bytes(), key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""
        bucket = self.bucket

        def op() -> list[ObjectInfo]:
            out = [
                ObjectInfo(b.name, int(b.size or 0), b.updated.timestamp() if b.updated else 0.0)
                for b in bucket.client.list_blobs(bucket, prefix=prefix or None)
            ]
            return sorted(out, key=lambda o: o.key)

        return self._call("listing of", op, None)

    def delete(self, key: str) -> None:
        """Delete one object; a missing key is not an error."""
        bucket = self.bucket
        with contextlib.suppress(ObjectNotFoundError):
            self._call("delete of", lambda: bucket.blob(key).delete(), key)

    def exists(self, key: str) -> bool:
        """Whether the object exists."""
        bucket = self.bucket
        return self._call("stat of", lambda: bucket.get_blob(key) is not None, key)

    def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFoundError if missing."""
        bucket = self.bucket
        blob = self._call("stat of", lambda: bucket.get_blob(key), key)
        if blob is None:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist")
        return int(blob.size or 0)


# --------------------------------------------------------------------------- local directory


class LocalBucket:
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

    def _check_outage(self) -> None:
        if (self.root / STORAGE_OUTAGE_MARKER).exists():
            raise TransientStorageError(f"{self.url} is unavailable (simulated outage)")

    @staticmethod
    def _classify(err: BaseException) -> str | None:
        if isinstance(err, (IsADirectoryError, NotADirectoryError)):
            return _short(err)
        if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.ENAMETOOLONG):
            return _short(err)
        return None  # EACCES, EIO, ENOSPC, a vanished mount: may pass

    def _call(self, what: str, op: Callable[[], T], key: str | None) -> T:
        def guarded() -> T:
            self._check_outage()
            try:
                return op()
            except FileNotFoundError as err:
                if key is not None:
                    raise ObjectNotFoundError(f"{self.url}/{key} does not exist") from err
                raise

        return _retry(
            guarded,
            what=f"{what} {self.url}/{key or ''}",
            classify=self._classify,
            budget=self.retry_seconds,
        )

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

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key (temporary files hidden)."""

        def op() -> list[ObjectInfo]:
            if not self.root.is_dir():
                return []
            # Walk only the deepest directory the prefix names in full.
            base_parts = prefix.split("/")[:-1]
            base = self.root.joinpath(*[p for p in base_parts if p])
            if not base.is_dir():
                return []
            out = []
            for dirpath, _dirs, files in os.walk(base):
                for f in files:
                    if f.endswith(".part") or f == STORAGE_OUTAGE_MARKER:
                        continue
                    full = Path(dirpath) / f
                    key = full.relative_to(self.root).as_posix()
                    if key.startswith(prefix):
                        try:
                            st = full.stat()
                        except FileNotFoundError:
                            continue
                        out.append(ObjectInfo(key, st.st_size, st.st_mtime))
            return sorted(out, key=lambda o: o.key)

        return self._call("listing of", op, None)

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
