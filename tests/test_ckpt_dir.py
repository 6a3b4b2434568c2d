"""`--ckpt-dir`: a folder on every node that survives preemption, for scripts that save their own
snapshot (PyTorch's DDP tutorial style). Bad input; the cloud task (a MOUNT_CACHED mount and a
link); the local node folders against real S3, GCS and directory buckets; and a tutorial-style
script on 2 local nodes, preempted twice, ending with the uninterrupted run's weights."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import constants, layout
from mncloud.backends.base import RunState
from mncloud.backends.local.ckptdir import NodeFolder
from mncloud.backends.local.processes import node_tag
from mncloud.backends.local.state import LocalLaunch
from mncloud.cli import app
from mncloud.render import render
from mncloud.request import build_spec
from mncloud.storage import open_bucket
from mncloud.storage.folders import COMMITS
from tests.test_local import cli, run_log, state_of, up, wait_final, wait_until

pytestmark = pytest.mark.catalog
runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_snapshot.py"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ckpt-dir", "ckpt", "--cloud", "local"], "give an absolute folder"),
        (["--ckpt-dir", "/", "--cloud", "local"], "give an absolute folder"),
        (["--ckpt-dir", "{proj}/ckpt", "--cloud", "local"], "is inside the workdir"),
        (["--ckpt-dir", "/ckpt"], "needs --bucket s3://… or gs://… on a cloud"),
        (["--ckpt-dir", "/ckpt", "--bucket", "file:///tmp/b"], "needs --bucket s3://…"),
        (["--ckpt-dir", "/mncloud-bucket/x", "--bucket", "s3://team-b"], "overlaps"),
    ],
)
def test_bad_ckpt_dir_is_one_line_and_exit_2(project: Path, flags: list[str], message: str) -> None:
    flags = [f.format(proj=project) for f in flags]
    result = runner.invoke(app, ["render", str(project / "train.py"), "--gpus", "H100:8", *flags])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --ckpt-dir"), result.output
    assert message in lines[0]


def test_the_cloud_task_mounts_the_bucket_and_links_the_folder(project: Path) -> None:
    spec = build_spec(
        project / "train.py", gpus="H100:8", nodes=2, bucket="gs://team-ckpt/exp", ckpt_dir="/ckpt"
    )
    config = render(spec).config
    assert config["envs"][constants.CKPT_DIR_ENV] == "/ckpt"
    assert config["file_mounts"] == {
        "/mncloud-bucket": {
            "source": "gs://team-ckpt",
            "mode": "MOUNT_CACHED",
            "type": "MODEL_CHECKPOINT_RW",
        }
    }
    assert "ckpt_target=/mncloud-bucket/exp/train/ckpt-dir" in config["run"]
    local = build_spec(project / "train.py", gpus="cpu:1", cloud=["local"], ckpt_dir="/ckpt")
    config = render(local).config
    assert "file_mounts" not in config and "ckpt_target" not in config["run"]
    assert config["envs"][constants.CKPT_DIR_ENV] == "/ckpt"


# --------------------------------------------------------------------------- node folders


def _node_folder(tmp_path: Path, ckpt_uri: str, token: str = "t0") -> NodeFolder:
    launch = LocalLaunch(
        name="r", token=token, task_id="task", workdir=str(tmp_path), run="true",
        num_nodes=1, procs_per_node=1, master_port=29500, ckpt_uri=ckpt_uri,
    )  # fmt: skip
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(ckpt_uri), retry_seconds=5)
    return NodeFolder(tmp_path / f"run-{uuid.uuid4().hex[:6]}", launch, 0, bucket, prefix)


def _bucket_files(uri: str) -> dict[str, bytes]:
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
    base = f"{prefix}/" if prefix else ""
    return {  # the script's files; the folders' commit markers are mncloud's own
        o.key[len(base) :]: bucket.get_bytes(o.key)
        for o in bucket.list(base)
        if not o.key[len(base) :].startswith(f"{COMMITS}/")
    }


@pytest.mark.slow
def test_closed_files_reach_the_bucket_and_a_new_node_reads_them(
    bucket_uri: str, tmp_path: Path
) -> None:
    node = _node_folder(tmp_path, bucket_uri)
    assert node.restore() == (0, 0)
    (node.path / "sub").mkdir()
    (node.path / "snapshot.pt").write_bytes(b"epoch 3")
    (node.path / "sub" / "log.txt").write_bytes(b"x")
    assert node.sync() == []  # first seen: it must keep still for one scan
    assert sorted(node.sync()) == ["snapshot.pt", "sub/log.txt"]
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"epoch 3", "sub/log.txt": b"x"}
    (node.path / "sub" / "log.txt").unlink()
    node.sync()
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"epoch 3"}
    fresh = _node_folder(tmp_path, bucket_uri)  # a relaunched node, a new disk
    assert fresh.restore() == (0, 1)
    assert (fresh.path / "snapshot.pt").read_bytes() == b"epoch 3"


def test_a_file_still_open_for_writing_is_not_uploaded(bucket_uri: str, tmp_path: Path) -> None:
    """Like MOUNT_CACHED: a file goes up once closed, so a half-written snapshot never does."""
    node = _node_folder(tmp_path, bucket_uri, token="writer")
    node.restore()
    target = node.path / "snapshot.pt"
    target.write_bytes(b"old, whole")
    node.sync(), node.sync()
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import sys; f = open({str(target)!r}, 'wb'); f.write(b'half');"
         " f.flush(); print('ready', flush=True); sys.stdin.read(); f.write(b' and rest')"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", constants.LOCAL_NODE_TAG_ENV: node_tag("writer", 0)},
    )  # fmt: skip
    assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
    for _ in range(3):
        assert node.sync() == []
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"old, whole"}
    writer.communicate(b"", timeout=30)
    node.sync()
    assert node.sync() == ["snapshot.pt"]
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"half and rest"}


def test_write_then_rename_and_a_preempted_node_losing_its_folder(
    bucket_uri: str, tmp_path: Path
) -> None:
    node = _node_folder(tmp_path, bucket_uri)
    node.restore()
    (node.path / "snapshot.pt.partial").write_bytes(b"epoch 1")
    (node.path / "snapshot.pt.partial").rename(node.path / "snapshot.pt")
    node.sync(), node.sync()
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"epoch 1"}
    (node.path / "snapshot.pt.partial").write_bytes(b"epoch 2")
    (node.path / "snapshot.pt.partial").rename(node.path / "snapshot.pt")
    node.drop()  # preempted before the next scan: its disk, and epoch 2, are gone
    assert not node.path.exists()
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"epoch 1"}
    node.restore()
    (node.path / "snapshot.pt").write_bytes(b"epoch 3")
    assert node.sync(final=True) == ["snapshot.pt"]  # the node exited: flushed at once
    assert _bucket_files(bucket_uri) == {"snapshot.pt": b"epoch 3"}


# --------------------------------------------------------------------------- end to end


def _weights(uri: str) -> str:
    return hashlib.sha256(_bucket_files(uri)["final.pt"]).hexdigest()


@pytest.mark.slow
def test_tutorial_script_preempted_twice_ends_with_the_uninterrupted_weights(s3_env) -> None:
    """A script that saves its own snapshot.pt (no mncloud import), 2 nodes, two preemptions."""
    import torch

    flags = ["--nodes", "2", "--gpus", "cpu:1", "--ckpt-dir", "/ckpt", "--recovery-delay", "0.5s"]
    # 24 epochs of 0.6 s: after the second preemption's trigger (epoch first + 2, first read
    # at >= 3) there are many epochs left, however late a loaded machine sees the snapshots.
    args = ["24", "1", "--epoch-seconds", "0.6"]
    up("snap-ref", EXAMPLE, *flags, script_args=["24", "1"])  # the same weights, unpaced
    bucket = s3_env.make_bucket()
    up("snap", EXAMPLE, *flags, "--bucket", f"s3://{bucket}/exp", script_args=args)
    uri = f"s3://{bucket}/exp/snap"

    def snapshot_epoch() -> int:
        files = _bucket_files(uri)
        if "snapshot.pt" not in files:
            return 0
        path = Path(f"/tmp/mncloud-snap-{uuid.uuid4().hex}")
        path.write_bytes(files["snapshot.pt"])
        try:
            return int(torch.load(path, weights_only=True)["EPOCHS_RUN"])
        finally:
            path.unlink()

    first = wait_until(lambda: snapshot_epoch() >= 3 and snapshot_epoch(), 180, "a snapshot")
    cli("chaos", "preempt", "snap", "--node", "1")
    wait_until(lambda: state_of("snap").attempt == 2, 60, "attempt 2")
    wait_until(lambda: snapshot_epoch() >= first + 2, 180, "a newer snapshot in attempt 2")
    cli("chaos", "preempt", "snap", "--node", "0")
    state = wait_final("snap", timeout=300)
    assert state.state is RunState.SUCCEEDED, run_log("snap")
    assert (state.restarts, state.preemptions) == (2, 2)
    log = run_log("snap")
    assert log.count("Resuming training from snapshot") >= 4, log  # both nodes, twice
    ref = wait_final("snap-ref", timeout=300)
    assert ref.state is RunState.SUCCEEDED, run_log("snap-ref")
    assert _weights(uri) == _weights(ref.ckpt_uri)
    listing = cli("ckpt", "ls", "snap").output
    assert "snapshot.pt" in listing and "final.pt" in listing
    assert "--ckpt-dir holds" in cli("status", "snap").output
    time.sleep(0)  # nothing left to wait for: the runs ended
