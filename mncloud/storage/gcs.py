"""Google Cloud Storage through google-cloud-storage: the `Bucket` operations and the client.

Resumable uploads above 8 MiB. `STORAGE_EMULATOR_HOST` is honoured (then anonymous credentials
are used, as the emulators expect). The SDK's own retries (up to 120 s by default) are switched
off for the object operations, so an outage is retried by one layer only (`retry.py`).
google-cloud-storage is imported on first use, so importing this module stays fast.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from mncloud.errors import StorageError
from mncloud.storage.buckets import (
    ObjectInfo,
    ObjectNotFoundError,
    RetryingBucket,
    atomic_path,
    checked_range,
)
from mncloud.storage.retry import (
    DEFAULT_RETRY_SECONDS,
    error_chain,
    isolate_sdk_random,
    raised_by,
    refused_locally,
)

MiB = 1024 * 1024
EMULATOR_PROJECT = "mncloud-emulator"
#: Where google-cloud-storage checks arguments before sending a request (a ValueError or
#: TypeError raised there is never transient; one from json or requests below it may be).
_SDK_MODULES = ("google.cloud.storage", "google.resumable_media")


def make_client() -> Any:
    """A google.cloud.storage Client: anonymous against an emulator, else the default
    credentials; StorageError saying how to log in when there are none."""
    from google.cloud import storage

    isolate_sdk_random("gs")
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT", EMULATOR_PROJECT),
            credentials=AnonymousCredentials(),
        )
    try:
        return storage.Client()
    except Exception as err:  # google.auth raises DefaultCredentialsError and OSError types
        raise StorageError(
            f"no Google credentials ({type(err).__name__}); run `gcloud auth application-default "
            "login` or set GOOGLE_APPLICATION_CREDENTIALS (then `sky check gcp`)"
        ) from None


def short_retry() -> Any:
    """The SDK's own retry bounded to 10 s, for calls made while the user waits."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(10)


class GCSBucket(RetryingBucket):
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
            client = make_client()
            try:
                self._bucket = client.bucket(self.name)
            except ValueError as err:  # its own check of the name, before any request
                raise StorageError(f"{self.url}: {refused_locally(err)}") from None
        return self._bucket

    def _classify(self, err: BaseException) -> str | None:
        from google.api_core import exceptions as gexc

        for e in error_chain(err):
            if isinstance(e, (ValueError, TypeError)) and raised_by(e, *_SDK_MODULES):
                return refused_locally(e)  # an argument the SDK refused before sending it
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

    def _is_not_found(self, err: Exception) -> bool:
        from google.api_core import exceptions as gexc

        return isinstance(err, gexc.NotFound) and "bucket" not in str(err).lower()

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a file (resumable, in `chunk_size` pieces, above 8 MiB)."""
        bucket = self.bucket
        chunk = self.chunk_size if os.path.getsize(path) > 8 * MiB else None
        self._call(
            "upload to",
            lambda: bucket.blob(key, chunk_size=chunk).upload_from_filename(str(path), retry=None),
            key,
        )

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Download to `path` (atomically)."""
        bucket = self.bucket

        def op() -> None:
            with atomic_path(path) as tmp:
                bucket.blob(key).download_to_filename(str(tmp), retry=None)

        self._call("download of", op, key)

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write a small object in one request."""
        bucket = self.bucket
        self._call("write of", lambda: bucket.blob(key).upload_from_string(data, retry=None), key)

    def get_bytes(self, key: str) -> bytes:
        """Read a whole object."""
        bucket = self.bucket
        return self._call("read of", lambda: bucket.blob(key).download_as_bytes(retry=None), key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read `length` bytes from offset `start`: one ranged GET."""
        if length == 0:
            return b""
        bucket = self.bucket
        end = start + length - 1  # inclusive, as the API takes it

        def op() -> bytes:
            from google.api_core import exceptions as gexc

            try:
                return bytes(bucket.blob(key).download_as_bytes(start=start, end=end, retry=None))
            except gexc.RequestRangeNotSatisfiable:  # starts past the end: a short read
                return b""

        return checked_range(self.url, key, start, length, self._call("read of", op, key))

    def read_range_into(self, key: str, start: int, out: memoryview) -> None:
        """Read `len(out)` bytes from offset `start` into `out` (the client gives bytes)."""
        data = self.get_range(key, start, len(out)) if len(out) else b""
        out[: len(data)] = data

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""
        bucket = self.bucket

        def op() -> list[ObjectInfo]:
            blobs = bucket.client.list_blobs(bucket, prefix=prefix or None, retry=None)
            out = [
                ObjectInfo(b.name, int(b.size or 0), b.updated.timestamp() if b.updated else 0.0)
                for b in blobs
            ]
            return sorted(out, key=lambda o: o.key)

        return self._call("listing of", op, None)

    def delete(self, key: str) -> None:
        """Delete one object; a missing key is not an error."""
        bucket = self.bucket
        with contextlib.suppress(ObjectNotFoundError):
            self._call("delete of", lambda: bucket.blob(key).delete(retry=None), key)

    def exists(self, key: str) -> bool:
        """Whether the object exists."""
        bucket = self.bucket
        return self._call("stat of", lambda: bucket.get_blob(key, retry=None) is not None, key)

    def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFoundError if missing."""
        bucket = self.bucket
        blob = self._call("stat of", lambda: bucket.get_blob(key, retry=None), key)
        if blob is None:
            raise ObjectNotFoundError(f"{self.url}/{key} does not exist")
        return int(blob.size or 0)
