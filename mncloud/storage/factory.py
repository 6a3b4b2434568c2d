"""`open_bucket`: the one place a bucket URL becomes a `Bucket` of the right kind.

The base module (`buckets.py`) never builds its subclasses; this factory imports each kind where
its scheme is asked for, so opening a local bucket never loads an S3 or GCS client.
"""

from __future__ import annotations

from mncloud.storage.buckets import Bucket, LocalBucket
from mncloud.storage.retry import retry_seconds_from_env
from mncloud.storage.url import BucketURL


def open_bucket(uri: str | BucketURL, *, retry_seconds: float | None = None) -> tuple[Bucket, str]:
    """Open the bucket a URL names; return it and the key prefix inside it (no slashes at ends).

    The URL's syntax is checked here; the cloud's naming rules were checked when the run was
    specified (see `url.py`).
    """
    url = uri if isinstance(uri, BucketURL) else BucketURL.parse(uri, check_name=False)
    budget = retry_seconds_from_env() if retry_seconds is None else retry_seconds
    if url.scheme == "s3":
        from mncloud.storage.s3 import S3Bucket  # boto3 loads only for an s3:// bucket

        return S3Bucket(url.name, retry_seconds=budget), url.prefix
    if url.scheme == "gs":
        from mncloud.storage.gcs import GCSBucket

        return GCSBucket(url.name, retry_seconds=budget), url.prefix
    return LocalBucket(url.name, retry_seconds=budget), url.prefix
