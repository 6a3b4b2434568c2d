"""Bucket preparation against a real S3 server and the GCS emulator (tests/servers.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from mncloud.errors import StorageError
from mncloud.storage.prepare import (
    BucketState,
    creation_region,
    egress_warning,
    inspect_bucket,
    prepare_bucket,
)
from tests.servers import GCSServer, S3Server


def _name() -> str:
    return f"mn-{uuid.uuid4().hex[:12]}"


def test_s3_missing_bucket_is_announced_then_created(s3_env: S3Server) -> None:
    name = _name()
    said: list[str] = []
    state, warning = prepare_bucket(f"s3://{name}/team", "aws", "us-east-1", said.append)
    assert said == [f"Bucket s3://{name} does not exist: creating it in aws us-east-1."]
    assert state.exists and state.created and state.cloud == "aws"
    assert warning is None
    assert name in [b["Name"] for b in s3_env.client().list_buckets()["Buckets"]]
    # A second launch finds it and says nothing.
    again, _ = prepare_bucket(f"s3://{name}", "aws", "us-east-1", said.append)
    assert again.exists and not again.created and len(said) == 1
    assert again.region == "us-east-1"


def test_s3_existing_bucket_in_another_cloud_warns_about_egress(s3_env: S3Server) -> None:
    name = s3_env.make_bucket()
    state, warning = prepare_bucket(f"s3://{name}", "gcp", "us-east4")
    assert state.exists and not state.created
    assert warning is not None and "egress" in warning and f"s3://{name}" in warning


def test_s3_unreachable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.servers import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    with pytest.raises(StorageError, match=r"cannot reach s3://\S+: .* unreachable"):
        inspect_bucket(f"s3://{_name()}")


def test_gcs_missing_bucket_is_created_in_the_cluster_region(
    gcs_env: GCSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.cloud import storage

    asked: list[str | None] = []
    real_create = storage.Client.create_bucket

    def spy(self, name, *args, location=None, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(location)
        return real_create(self, name, *args, location=location, **kwargs)

    monkeypatch.setattr(storage.Client, "create_bucket", spy)
    name = _name()
    said: list[str] = []
    state, _ = prepare_bucket(f"gs://{name}/ckpt", "gcp", "us-central1", said.append)
    assert said == [f"Bucket gs://{name} does not exist: creating it in gcp us-central1."]
    assert asked == ["us-central1"]
    assert state.exists and state.created
    # The emulator files every bucket under "US"; we report what GCS says, not what we asked.
    found = inspect_bucket(f"gs://{name}")
    assert found.exists and found.region == state.region


def test_gcs_bucket_in_another_region_warns(gcs_env: GCSServer) -> None:
    name = gcs_env.make_bucket()
    location = inspect_bucket(f"gs://{name}").region
    assert location == "us"  # the emulator's answer for every bucket
    _, warning = prepare_bucket(f"gs://{name}", "gcp", "europe-west4")
    assert warning is not None and "europe-west4" in warning and "cross-region" in warning
    _, same = prepare_bucket(f"gs://{name}", "gcp", "us-central1")
    assert same is None


def test_file_bucket_is_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    state, warning = prepare_bucket(f"file://{folder}", "lambda", "us-east-1")
    assert folder.is_dir() and state.created and warning is None


@pytest.mark.parametrize(
    ("bucket_cloud", "bucket_region", "cloud", "region", "expected"),
    [
        ("aws", "us-east-1", "aws", "us-east-1", None),
        ("aws", "us-east-1", "aws", "us-west-2", "cross-region"),
        ("aws", "us-east-1", "lambda", "us-east-1", "egress"),
        ("gcp", "us", "gcp", "us-central1", None),
        ("gcp", "us", "gcp", "europe-west4", "cross-region"),
    ],
)
def test_egress_warning(
    bucket_cloud: str, bucket_region: str, cloud: str, region: str, expected: str | None
) -> None:
    state = BucketState("x://b", exists=True, cloud=bucket_cloud, region=bucket_region)
    warning = egress_warning(state, cloud, region)
    assert (warning is None) if expected is None else (expected in (warning or ""))


def test_creation_region_follows_the_cluster_on_its_own_cloud(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert creation_region("s3://bkt", "aws", "us-west-2") == "us-west-2"
    assert creation_region("s3://bkt", "lambda", "us-east-1") == "eu-west-1"
    assert creation_region("gs://bkt", "aws", "us-east-1") == "us"
    assert creation_region("gs://bkt", "gcp", "asia-northeast1") == "asia-northeast1"
