"""A bucket name no cloud serves is refused by the one URL parser, in one line, at once; and a
request an SDK refuses before sending it is never retried.

`mncloud ckpt` reads any bucket the cloud still serves (legacy S3 names with capitals or
underscores too, `check_name=False`), but a 300-character name is no bucket's: it used to reach
boto3, whose local `ParamValidationError` the retry layer took for a transient failure and
retried, logging each try, for the whole retry budget.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud.cli import app
from mncloud.errors import SpecError, StorageError
from mncloud.storage import BucketURL
from mncloud.storage.retry import call_with_retry
from mncloud.storage.url import MAX_SERVED_LENGTH, served_name_error

runner = CliRunner()
LONG = "a" * 300


@pytest.mark.parametrize(
    "args",
    [
        ["ckpt", "ls", f"s3://{LONG}"],
        ["ckpt", "ls", f"gs://{LONG}/run"],
        ["ckpt", "verify", f"s3://{LONG}/run"],
        ["ckpt", "pull", f"gs://{LONG}", "latest", "out"],
        ["ckpt", "rm", f"s3://{LONG}", "3", "--yes"],
    ],
    ids=["ls-s3", "ls-gs", "verify", "pull", "rm"],
)
def test_a_300_character_bucket_name_is_one_line_and_exit_2_at_once(
    args: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MNCLOUD_STORAGE_RETRY_SECONDS", "30")  # a retry would be logged
    with caplog.at_level(logging.WARNING, logger="mncloud"):
        result = runner.invoke(app, args)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bucket URL ")
    assert "300 characters long" in lines[0] and len(lines[0]) < 400  # the name shown cut
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_what_the_clouds_serve_and_what_they_never_do() -> None:
    """Without the new-bucket check (`ckpt`, `open_bucket`): legacy S3 names pass, names no
    bucket can have do not; with it (`--bucket`): the rules for a new bucket."""
    for ok in ("team-ckpt", "Upper_Case", "a" * 255, "b"):
        assert served_name_error("s3", ok) is None, ok
        BucketURL.parse(f"s3://{ok}/p", check_name=False)
    for ok in ("my_bucket.v1", "b", "a" * 63 + "." + "a" * 63, "x" * 222):
        assert served_name_error("gs", ok) is None, ok
    for scheme, bad in (
        ("s3", "a" * 256), ("s3", "x y"), ("s3", "ünï"), ("s3", "a:b"),
        ("gs", "a" * 223), ("gs", "-bad-"), ("gs", "x y"), ("gs", "bad."),
    ):  # fmt: skip
        assert served_name_error(scheme, bad) is not None, bad
        with pytest.raises(SpecError) as err:
            BucketURL.parse(f"{scheme}://{bad}/p", check_name=False)
        assert isinstance(err.value, StorageError)
    assert MAX_SERVED_LENGTH == {"s3": 255, "gs": 222}
    # The check for a new bucket (`--bucket`) is SkyPilot's, with a long name said shortly.
    with pytest.raises(SpecError, match="lowercase"):
        BucketURL.parse("s3://Upper_Case")
    with pytest.raises(SpecError, match="300 characters long") as err:
        BucketURL.parse(f"s3://{LONG}")
    assert LONG not in str(err.value)
    with pytest.raises(SpecError, match="between 3"):
        BucketURL.parse("s3://" + "a" * 64)
    assert BucketURL.parse("gs://" + "a" * 63 + "." + "b" * 63).name.startswith("a")


def test_a_botocore_validation_error_is_not_retried() -> None:
    """The retry predicate on a real botocore exception: permanent, so one attempt."""
    from botocore.exceptions import ParamValidationError

    from mncloud.storage.s3 import S3Bucket

    bucket = S3Bucket("team-ckpt", retry_seconds=30)
    err = ParamValidationError(report='Invalid bucket name "x": Bucket name must match')
    message = bucket._classify(err)
    assert message is not None and "ParamValidationError" in message
    assert "\n" not in message

    attempts = []

    def op() -> None:
        attempts.append(1)
        raise err

    with pytest.raises(StorageError, match="refused before anything was sent"):
        call_with_retry(op, what="listing of s3://x/", classify=bucket._classify, budget=30)
    assert len(attempts) == 1


def test_boto3_refusing_a_name_locally_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the parser (an `S3Bucket` made directly): boto3's own refusal, before any
    network, is one StorageError after one attempt, with no retry logged."""
    from mncloud.storage.s3 import S3Bucket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached
    bucket = S3Bucket("a" * 256, retry_seconds=30)
    with (
        caplog.at_level(logging.WARNING, logger="mncloud"),
        pytest.raises(StorageError, match="ParamValidationError"),
    ):
        bucket.list("run/")
    # A retry would be logged (and take the 30 s budget); no timing: a busy CI is slow.
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_a_google_cloud_storage_argument_error_is_not_retried() -> None:
    """A ValueError raised inside google-cloud-storage (its own check of an argument) is
    permanent; one raised elsewhere (a JSON body cut short) stays transient."""
    import json

    from google.cloud.storage._helpers import _validate_name

    from mncloud.storage.gcs import GCSBucket

    bucket = GCSBucket("team-ckpt")
    try:
        _validate_name("-bad-")
    except ValueError as err:
        message = bucket._classify(err)
    assert message is not None and "start and end with a number or letter" in message
    try:
        json.loads("{")
    except ValueError as err:
        assert bucket._classify(err) is None


def test_the_gcs_sdk_refusing_a_name_is_a_storage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A `GCSBucket` made directly with a name google-cloud-storage refuses: a StorageError
    (one line from the CLI), not a traceback."""
    from mncloud.storage.gcs import GCSBucket

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # never reached
    with pytest.raises(StorageError, match="refused before anything was sent"):
        GCSBucket("-bad-").list()
