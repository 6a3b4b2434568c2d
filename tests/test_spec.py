"""JobSpec: parsing and validation of a request (flags and mncloud.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mncloud.errors import SpecError
from mncloud.request import build_spec
from mncloud.spec import Accelerator, BucketURL, SpotPolicy

pytestmark = pytest.mark.catalog


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    path = tmp_path / "src" / "train.py"
    path.parent.mkdir()
    path.write_text("print('hi')\n")
    return path


@pytest.mark.parametrize(
    ("text", "name", "count"),
    [
        ("H100:8", "H100", 8),
        ("h100:8", "H100", 8),
        ("a100-80gb:4", "A100-80GB", 4),
        ("L4", "L4", 1),
        ("cpu:2", "cpu", 2),
        ("CPU:3", "cpu", 3),
    ],
)
def test_accelerator_is_canonicalised_like_skypilot(text: str, name: str, count: int) -> None:
    assert Accelerator.parse(text) == Accelerator(name=name, count=count)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("H100:0", "at least 1"),
        ("FOO:8", "knows no accelerator"),
        ("H100:x", "not a whole number"),
        (":8", r"NAME\[:COUNT\]"),
        ("H100:-2", "at least 1"),
    ],
)
def test_bad_accelerators_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        Accelerator.parse(text)


def test_close_accelerator_names_are_suggested() -> None:
    with pytest.raises(SpecError, match=r"did you mean .*H100"):
        Accelerator.parse("H10:8")


@pytest.mark.parametrize(
    ("url", "scheme", "name", "prefix"),
    [
        ("s3://team-ckpt", "s3", "team-ckpt", ""),
        ("s3://team-ckpt/a/b/", "s3", "team-ckpt", "a/b"),
        ("gs://my_bucket.v1/x", "gs", "my_bucket.v1", "x"),
    ],
)
def test_bucket_urls(url: str, scheme: str, name: str, prefix: str) -> None:
    bucket = BucketURL.parse(url)
    assert (bucket.scheme, bucket.name, bucket.prefix) == (scheme, name, prefix)
    assert bucket.child("run") == f"{scheme}://{name}" + (f"/{prefix}" if prefix else "") + "/run"


def test_file_bucket_is_absolute(tmp_path: Path) -> None:
    assert str(BucketURL.parse(f"file://{tmp_path}")) == f"file://{tmp_path}"
    with pytest.raises(SpecError, match="absolute"):
        BucketURL.parse("file://relative/dir")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://x", "use s3://"),
        ("s3://Bad_Name", "lowercase"),
        ("s3://ab", "between 3"),
        ("team-ckpt", "use s3://"),
        ("s3://192.168.5.4", "IP address"),
        ("s3://team/a/../b", "'..'"),
    ],
)
def test_bad_buckets(url: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        BucketURL.parse(url)


def test_build_spec_from_flags(script: Path) -> None:
    spec = build_spec(
        script,
        ["--lr", "3e-4"],
        gpus="H100:8",
        nodes=4,
        spot=True,
        bucket="s3://team-ckpt",
        env=["A=1", "B=x=y"],
        secret=["HF_TOKEN"],
        cloud=["AWS"],
        region=["us-east-1"],
        label=["team=ml"],
        disk_size=256,
    )
    assert spec.workdir == script.parent.parent
    assert spec.script_relpath == "src/train.py"
    assert spec.script_args == ["--lr", "3e-4"]
    assert spec.accelerator == Accelerator(name="H100", count=8)
    assert spec.nodes == 4 and spec.spot is SpotPolicy.SPOT
    assert spec.envs == {"A": "1", "B": "x=y"}
    assert spec.secrets == ["HF_TOKEN"] and spec.clouds == ["aws"]
    assert spec.labels == {"team": "ml"} and spec.disk_size == 256
    assert spec.name == "train"


def test_project_config_gives_defaults_and_flags_override(script: Path) -> None:
    (script.parent.parent / "mncloud.yaml").write_text(
        "gpus: A100:8\nnodes: 2\nbucket: gs://team-ckpt\nenv: {WANDB_MODE: offline}\nspot: spot\n"
    )
    spec = build_spec(script, gpus=None, nodes=3)
    assert str(spec.accelerator) == "A100:8"
    assert spec.nodes == 3
    assert str(spec.bucket) == "gs://team-ckpt"
    assert spec.envs == {"WANDB_MODE": "offline"}
    assert spec.spot is SpotPolicy.SPOT


def test_project_config_rejects_unknown_keys(script: Path) -> None:
    (script.parent.parent / "mncloud.yaml").write_text("gpu: A100:8\n")
    with pytest.raises(SpecError, match=r"unknown option.*gpu.*allowed: gpus, nodes"):
        build_spec(script)


def test_project_config_names_a_mistyped_value(script: Path) -> None:
    (script.parent.parent / "mncloud.yaml").write_text("gpus: A100:8\nnodes: many\n")
    with pytest.raises(SpecError, match=r"mncloud.yaml: nodes: .*integer"):
        build_spec(script)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"nodes": 0}, "--nodes 0"),
        ({"nodes": -1}, "--nodes -1"),
        ({"env": ["NOVALUE"]}, "KEY=VALUE"),
        ({"env": ["1A=b"]}, "variable name"),
        ({"env": ["SKYPILOT_NODE_RANK=1"]}, "set by mncloud"),
        ({"cloud": ["nocloud"]}, "unknown; choose one of"),
        ({"name": "Bad_Name"}, "--name"),
        ({"mount_bucket": True}, "needs --bucket"),
        ({"region": ["us east"]}, "region name"),
    ],
)
def test_bad_flags(script: Path, kwargs: dict, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        build_spec(script, gpus="H100:8", **kwargs)


def test_missing_script(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        build_spec(tmp_path / "nope.py", gpus="H100:8")


def test_gpus_required(script: Path) -> None:
    with pytest.raises(SpecError, match="--gpus is required"):
        build_spec(script)


def test_project_config_null_means_unset(script: Path) -> None:
    """`key: null` (or a bare `key:`) in mncloud.yaml says nothing: the flag, else the default."""
    (script.parent.parent / "mncloud.yaml").write_text(
        "gpus: A100:8\nnodes: null\nspot:\nmax_restarts: ~\npreflight: null\nlauncher: null\n"
        "env: null\nname: null\nnetwork: null\ncloud: null\n"
    )
    spec = build_spec(script)
    assert (spec.nodes, spec.spot, spec.max_restarts) == (1, SpotPolicy.EITHER, 3)
    assert spec.preflight is True and spec.launcher.value == "torchrun"
    assert spec.envs == {} and spec.name == "train" and spec.clouds == []
    assert build_spec(script, nodes=2, name="x").nodes == 2


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gpus: A100:8\nnode: null\n", r"unknown option 'node' \(did you mean 'nodes'\?\)"),
        ("gpus: A100:8\nnodes: 0\n", r"--nodes 0"),
        ("gpus: A100:8\nnodes: [2]\n", r"mncloud.yaml: nodes: "),
    ],
)
def test_project_config_bad_key_or_value_beside_nulls(
    script: Path, text: str, fragment: str
) -> None:
    (script.parent.parent / "mncloud.yaml").write_text(text + "spot: null\n")
    with pytest.raises(SpecError, match=fragment):
        build_spec(script)
