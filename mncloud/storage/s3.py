"""S3 (and S3-compatible servers) through boto3: the `Bucket` operations and the client.

Multipart uploads with tuned concurrency (our own, part by part: see `_upload`);
`AWS_ENDPOINT_URL` (or `endpoint_url=`) points the client at any S3-compatible server; the
default credential chain only. botocore retries once inside a call (a blip in one part of a
multipart upload); longer outages are `retry.py`'s. boto3 is imported on first use, so
importing this module stays fast.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mncloud.storage.buckets import (
    ObjectInfo,
    ObjectNotFoundError,
    RetryingBucket,
    atomic_path,
    check_length,
    checked_range,
)
from mncloud.storage.retry import (
    DEFAULT_RETRY_SECONDS,
    error_chain,
    isolate_sdk_random,
    refused_locally,
)

MiB = 1024 * 1024
DEFAULT_REGION = "us-east-1"
#: Attempts botocore makes inside one call (the first plus one quick retry).
SDK_ATTEMPTS = 2

TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
    "ThrottlingException", "RequestTimeTooSkewed", "OperationAborted", "500", "502", "503", "504",
})  # fmt: skip
DENIED_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden",
    "ExpiredToken", "InvalidToken", "AllAccessDisabled",
})  # fmt: skip
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
NO_CREDENTIALS = (
    "no AWS credentials found; run `aws configure` or set AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY (default chain: environment, ~/.aws, instance role)"
)


def default_region() -> str:
    """`AWS_REGION`, `AWS_DEFAULT_REGION`, else us-east-1."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def error_code(err: Any) -> str:
    """The S3 error code of a botocore ClientError (`NoSuchBucket`, `403`, …)."""
    return str(err.response.get("Error", {}).get("Code", ""))


#: What a client's credentials, region and trust come from: a cached client is one made with
#: the same values (a process whose environment changes gets a new one).
CLIENT_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_SHARED_CREDENTIALS_FILE",
              "AWS_CONFIG_FILE", "AWS_CA_BUNDLE")  # fmt: skip
_MAX_CLIENTS = 32
_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()


def make_client(
    endpoint_url: str | None = None, *, read_timeout: float = 60, pool: int = 10
) -> Any:
    """A boto3 S3 client: short SDK retries, path-style addressing for a custom endpoint.

    One per process and settings, shared (boto3's clients are thread-safe): making one costs
    ~0.1 s of CPU (botocore loads S3's service model), which a rank writing its telemetry
    every half second, or a loop polling a bucket, would otherwise pay each time."""
    endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    key = (os.getpid(), endpoint_url, read_timeout, pool, *map(os.environ.get, CLIENT_ENV))
    with _clients_lock:
        if key not in _clients:
            if len(_clients) >= _MAX_CLIENTS:
                _clients.clear()
            _clients[key] = _new_client(endpoint_url, read_timeout, pool)
        return _clients[key]


def _new_client(endpoint_url: str | None, read_timeout: float, pool: int) -> Any:
    import boto3
    from botocore.config import Config

    isolate_sdk_random("s3")
    config = Config(
        retries={"mode": "standard", "total_max_attempts": SDK_ATTEMPTS},
        max_pool_connections=pool,
        connect_timeout=5,
        read_timeout=read_timeout,
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    session = boto3.session.Session()
    region = session.region_name or default_region()
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def client_side_errors() -> tuple[type[BaseException], ...]:
    """botocore's errors for a request it refuses before sending it (a bad parameter, such as
    a bucket name outside `[a-zA-Z0-9.-_]{1,255}`, or a bad configuration): never transient."""
    from botocore import exceptions as bx

    return (
        bx.ParamValidationError,  # the parameters, the bucket name among them
        bx.ValidationError,  # UnknownParameterError, RangeError, InvalidRegionError, …
        bx.MissingParametersError,
        bx.UnknownClientMethodError,
        bx.InvalidS3AddressingStyleError,
        bx.UnsupportedS3ArnError,
        bx.InvalidHostLabelError,
        bx.InvalidEndpointConfigurationError,
    )


class S3Bucket(RetryingBucket):
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
            from boto3.s3.transfer import TransferConfig

            self._client = make_client(self.endpoint_url, pool=max(10, 2 * self.max_concurrency))
            self._transfer = TransferConfig(
                multipart_threshold=self.chunk_size,
                multipart_chunksize=self.chunk_size,
                max_concurrency=self.max_concurrency,
                use_threads=True,
            )
        return self._client

    def _classify(self, err: BaseException) -> str | None:
        from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

        for e in error_chain(err):
            if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
                return NO_CREDENTIALS
            if isinstance(e, client_side_errors()):
                return refused_locally(e)
            if isinstance(e, ClientError):
                code = error_code(e)
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
                if code in TRANSIENT_CODES or status >= 500 or status == 429:
                    return None
                if code == "NoSuchBucket":
                    where = f" at {self.endpoint_url}" if self.endpoint_url else ""
                    return f"bucket {self.url} does not exist{where}"
                if code in DENIED_CODES:
                    return f"access denied to {self.url} ({code}); check the credentials"
                return f"{code or status}: {e.response.get('Error', {}).get('Message', '')}"
        return None  # connection errors, timeouts and the like: transient

    def _is_not_found(self, err: Exception) -> bool:
        from botocore.exceptions import ClientError

        return isinstance(err, ClientError) and error_code(err) in NOT_FOUND_CODES

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a file: one PUT below `chunk_size`, else a multipart upload with
        `max_concurrency` parts in flight. The whole upload is retried on a transient failure."""
        client = self.client
        self._call("upload to", lambda: self._upload(client, key, Path(path)), key)

    def _upload(self, client: Any, key: str, path: Path) -> None:
        """Each part is read into memory and sent as one body: fewer Python calls per byte than
        s3transfer's streamed reads, which on a busy CPU was the slower path."""
        size = path.stat().st_size
        if size <= self.chunk_size:
            client.put_object(Bucket=self.name, Key=key, Body=path.read_bytes())
            return
        upload_id = client.create_multipart_upload(Bucket=self.name, Key=key)["UploadId"]

        def part(i: int) -> dict[str, Any]:
            with open(path, "rb") as f:
                f.seek(i * self.chunk_size)
                body = f.read(self.chunk_size)
            etag = client.upload_part(
                Bucket=self.name, Key=key, UploadId=upload_id, PartNumber=i + 1, Body=body
            )["ETag"]
            return {"ETag": etag, "PartNumber": i + 1}

        n_parts = -(-size // self.chunk_size)
        try:
            with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="mncloud-s3") as pool:
                parts = list(pool.map(part, range(n_parts)))
            client.complete_multipart_upload(
                Bucket=self.name, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            with contextlib.suppress(Exception):  # the retry starts a new upload
                client.abort_multipart_upload(Bucket=self.name, Key=key, UploadId=upload_id)
            raise

    # A multipart upload fed part by part (`mncloud.train.streaming`); each call is retried.
    def start_multipart(self, key: str) -> str:
        """Begin a multipart upload of `key`; its upload id."""
        client = self.client
        return self._call(
            "upload to",
            lambda: client.create_multipart_upload(Bucket=self.name, Key=key)["UploadId"],
        )

    def put_part(self, key: str, upload_id: str, number: int, body: bytes | bytearray) -> str:
        """Upload part `number` (from 1) of a multipart upload; its ETag."""
        client = self.client

        def op() -> str:
            return client.upload_part(
                Bucket=self.name, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            )["ETag"]

        return self._call(f"part {number} of upload to", op)

    def finish_multipart(self, key: str, upload_id: str, etags: list[str]) -> None:
        """Complete a multipart upload from its parts' ETags, in part order."""
        client = self.client
        parts = [{"ETag": etag, "PartNumber": i} for i, etag in enumerate(etags, 1)]
        self._call(
            "upload to",
            lambda: client.complete_multipart_upload(
                Bucket=self.name, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            ),
        )

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abandon a multipart upload (best effort: a failure is ignored)."""
        with contextlib.suppress(Exception):
            self.client.abort_multipart_upload(Bucket=self.name, Key=key, UploadId=upload_id)

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

    def _range_body(self, key: str, start: int, length: int) -> Any:
        """The body of one ranged GET of `length` bytes from `start`; None when the range starts
        past the object's end (a short read, as one that ends past it)."""
        from botocore.exceptions import ClientError

        span = f"bytes={start}-{start + length - 1}"
        try:
            return self.client.get_object(Bucket=self.name, Key=key, Range=span)["Body"]
        except ClientError as err:
            if error_code(err) in ("InvalidRange", "416"):
                return None
            raise

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read `length` bytes from offset `start`: one ranged GET."""
        if length == 0:
            return b""

        def op() -> bytes:
            body = self._range_body(key, start, length)
            return b"" if body is None else bytes(body.read())  # None: a short read

        return checked_range(self.url, key, start, length, self._call("read of", op, key))

    def read_range_into(self, key: str, start: int, out: memoryview) -> None:
        """Read `len(out)` bytes from offset `start` straight into `out`: one ranged GET whose
        body is read into the buffer (no bytes object in between)."""
        length = len(out)
        if length == 0:
            return

        def op() -> int:
            body = self._range_body(key, start, length)
            if body is None:
                return 0
            got = 0
            with contextlib.closing(body):
                while got < length and (n := body.readinto(out[got:])):
                    got += n
            return got

        check_length(self.url, key, start, length, self._call("read of", op, key))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""
        client = self.client

        def op() -> list[ObjectInfo]:
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=prefix
            )
            out = [
                ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                for page in pages
                for o in page.get("Contents", [])
            ]
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
