"""Bucket operations against real servers: S3 (SeaweedFS or moto), a GCS emulator, a directory."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mncloud.errors import SpecError, StorageError
from mncloud.storage import (
    Bucket,
    BucketURL,
    LocalBucket,
    ObjectNotFoundError,
    ShortReadError,
    delete_prefix,
    join_key,
    open_bucket,
    set_simulated_outage,
)


def test_one_parser_for_spec_and_storage(tmp_path: Path) -> None:
    """open_bucket reads a URL exactly as the spec does; a bad one is a SpecError and a
    StorageError alike (the CLI prints either as one line)."""
    for text, parts in (
        ("s3://b-1/run/1/", ("s3", "b-1", "run/1")),
        ("gs://b_1", ("gs", "b_1", "")),
        (f"file://{tmp_path}", ("file", str(tmp_path), "")),
    ):
        url = BucketURL.parse(text, check_name=False)
        assert (url.scheme, url.name, url.prefix) == parts
        bucket, prefix = open_bucket(text)
        assert (bucket.url, prefix) == (url.root, url.prefix)
    for bad in ("ftp://b/x", "s3://", "s3:///x", "", "b/x", "file://rel/dir", "s3://b/a/../c"):
        with pytest.raises(SpecError) as err:
            open_bucket(bad)
        assert isinstance(err.value, StorageError)
    assert join_key("a/", "", "/b", "c") == "a/b/c"


def test_open_bucket_does_not_import_skypilot(tmp_path: Path) -> None:
    """Every training rank opens its bucket: the cloud's name rules (SkyPilot, seconds to
    import) are checked where the run is specified, not here."""
    code = (
        "import sys; from mncloud.storage import open_bucket; "
        "open_bucket('s3://Upper_Case/x'); open_bucket('gs://b'); print('sky' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_local_bucket_of_a_directory(tmp_path: Path) -> None:
    bucket, prefix = open_bucket(BucketURL.directory(tmp_path / "d"))
    assert isinstance(bucket, LocalBucket) and prefix == ""
    assert bucket.list() == []  # a missing directory is an empty bucket


def test_bucket_operations(bucket_uri: str, tmp_path: Path) -> None:
    bucket, prefix = open_bucket(bucket_uri)
    assert isinstance(bucket, Bucket)
    k = lambda name: join_key(prefix, name)  # noqa: E731
    bucket.put_bytes(k("a/small"), b"hello")
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * (24 * 4096 + 7))  # ~24 MiB: multipart / resumable
    bucket.put_file(k("a/big"), big)
    bucket.put_bytes(k("b/other"), b"")

    assert bucket.get_bytes(k("a/small")) == b"hello"
    assert bucket.size(k("a/big")) == big.stat().st_size
    assert bucket.exists(k("a/small")) and not bucket.exists(k("a/missing"))
    listing = bucket.list(k("a/"))
    assert [o.key for o in listing] == [k("a/big"), k("a/small")]
    assert all(o.mtime > 0 for o in listing)
    out = tmp_path / "down" / "big"
    bucket.get_file(k("a/big"), out)
    assert out.read_bytes() == big.read_bytes()
    data = big.read_bytes()
    for start, length in ((0, 1), (5, 300), (16 * 2**20 - 3, 7), (len(data) - 9, 9), (42, 0)):
        assert bucket.get_range(k("a/big"), start, length) == data[start : start + length]
    into = memoryview(bytearray(40))
    bucket.read_range_into(k("a/big"), 16 * 2**20 - 3, into[5:30])
    assert bytes(into[5:30]) == data[16 * 2**20 - 3 : 16 * 2**20 + 22] and not any(into[:5])
    with pytest.raises(ShortReadError, match=r"returned 9 of 20"):
        bucket.read_range_into(k("a/big"), len(data) - 9, into[:20])
    with pytest.raises(ShortReadError, match=r"bytes .* returned 9 of 20"):
        bucket.get_range(k("a/big"), len(data) - 9, 20)  # past the end: named, not retried
    with pytest.raises(ShortReadError, match=r"bytes .* returned 0 of 4"):
        bucket.get_range(k("a/big"), len(data) + 10, 4)  # starts past it (S3 says 416)
    with pytest.raises(ObjectNotFoundError):
        bucket.get_range(k("a/missing"), 0, 4)
    with pytest.raises(ObjectNotFoundError):
        bucket.get_bytes(k("a/missing"))
    with pytest.raises(ObjectNotFoundError):
        bucket.size(k("a/missing"))
    bucket.delete(k("a/small"))
    bucket.delete(k("a/small"))  # missing is fine
    assert not bucket.exists(k("a/small"))
    assert delete_prefix(bucket, k("a")) == 1
    assert [o.key for o in bucket.list(prefix)] == [k("b/other")]


def test_missing_bucket_is_permanent(s3_env, gcs_env) -> None:
    for uri in ("s3://no-such-bucket-mncloud/x", "gs://no-such-bucket-mncloud/x"):
        bucket, _ = open_bucket(uri, retry_seconds=30)
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="does not exist"):
            bucket.list("x/")
        assert time.monotonic() - t0 < 10, "a permanent error must not be retried"


def test_wrong_credentials_are_not_logged(s3_env, monkeypatch, caplog) -> None:
    if s3_env.kind != "seaweedfs":
        pytest.skip("moto accepts any credentials")
    bucket_name = s3_env.make_bucket()
    secret = "very-secret-value-123"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    bucket, _ = open_bucket(f"s3://{bucket_name}", retry_seconds=5)
    with caplog.at_level(logging.DEBUG, logger="mncloud"), pytest.raises(StorageError) as err:
        bucket.put_bytes("k", b"x")
    assert "denied" in str(err.value) or "SignatureDoesNotMatch" in str(err.value)
    assert secret not in str(err.value) and secret not in caplog.text


def test_s3_retries_through_an_outage(s3_env, tmp_path: Path) -> None:
    """The server is down for ~3 s; an upload started meanwhile succeeds once it is back."""
    name = s3_env.make_bucket()
    bucket, _ = open_bucket(f"s3://{name}", retry_seconds=60)
    src = tmp_path / "f"
    src.write_bytes(b"x" * 1024)
    s3_env.stop()
    restart = threading.Timer(3.0, s3_env.start)
    restart.start()
    try:
        bucket.put_file("after-outage", src)
    finally:
        restart.join()
    assert bucket.get_bytes("after-outage") == b"x" * 1024


def test_s3_outage_longer_than_budget_raises(s3_env) -> None:
    name = s3_env.make_bucket()
    bucket, _ = open_bucket(f"s3://{name}", retry_seconds=1)
    s3_env.stop()
    try:
        with pytest.raises(StorageError, match="still failing"):
            bucket.put_bytes("k", b"x")
    finally:
        s3_env.start()


def test_file_simulated_outage(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'b'}"
    bucket, _ = open_bucket(uri, retry_seconds=0.5)
    bucket.put_bytes("k", b"1")
    set_simulated_outage(uri, True)
    with pytest.raises(StorageError, match="simulated outage"):
        bucket.get_bytes("k")
    bucket2, _ = open_bucket(uri, retry_seconds=10)
    threading.Timer(1.0, set_simulated_outage, (uri, False)).start()
    assert bucket2.get_bytes("k") == b"1"
    assert [o.key for o in bucket2.list("")] == ["k"]
