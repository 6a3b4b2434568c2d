"""What a `--ckpt-dir` restore brings (storage/folderrestore.py, transfer.py), against the real
S3 server: the newest `checkpoint-N/` or `step-N/` and the Trainer's named best, every other
unit as before; the older folders stay in the bucket, listed by `ckpt ls`, never deleted for
being absent, and go when the framework's own rotation passes them; a short read, an object
gone or a hash that fails mid-restore refuses the newest and restores the next older, nothing
half-restored; ranges in parallel, hashed in order; a disk too small (a real tmpfs) is one
line and exit 2 with nothing fetched, on a cloud node's process and on a local run; the real
Trainer resumes from what was restored and its rotation empties the bucket as it empties
the node."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import layout
from mncloud.cli import app
from mncloud.storage import folders, join_key, open_bucket
from mncloud.storage.foldersync import NodeSync, restored_line
from mncloud.storage.s3 import S3Bucket
from mncloud.storage.transfer import PART, BadObject, fetch, put_stream
from tests.servers import ByteCountingProxy, S3Server

runner = CliRunner()
WIDE = {"COLUMNS": "250"}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def s3_uri(s3_env: S3Server) -> str:
    return f"s3://{s3_env.make_bucket()}/exp/run"


class Nodes:
    """Node folders of one run's `ckpt-dir` in the real S3 server."""

    def __init__(self, root: Path, uri: str, nodes: int = 1) -> None:
        self.root, self.uri, self.nodes = root, uri, nodes
        self.bucket, self.prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)

    def node(self, n: int = 0) -> NodeSync:
        path = self.root / f"node-{n}-{uuid.uuid4().hex[:6]}"
        return NodeSync(path, path.with_suffix(".up"), self.bucket, self.prefix, n, self.nodes, set)

    def committed(self) -> set[str]:
        return {v.name for v in folders.judge(self.bucket, self.prefix) if v.committed}

    def keys(self, unit: str) -> list[str]:
        return [o.key for o in self.bucket.list(f"{self.prefix}/{unit}/")]


def settle(*nodes: NodeSync) -> None:
    for node in nodes:
        node.sync(), node.sync()


def save_trainer(node: NodeSync, step: int, best: int | None = None, size: int = 4096) -> None:
    """A Trainer-shaped `checkpoint-N/` (node 0 writes the shared files, every node its RNG
    state), its `trainer_state.json` naming `best` as the Trainer does (a path)."""
    tmp = node.path / f"tmp-checkpoint-{step}"
    tmp.mkdir(parents=True)
    if node.node == 0:
        (tmp / "model.safetensors").write_bytes(os.urandom(size))
        (tmp / "optimizer.pt").write_bytes(os.urandom(2 * size))
        best_dir = str(node.path / f"checkpoint-{best}") if best else None
        state = {"global_step": step, "best_model_checkpoint": best_dir}
        (tmp / "trainer_state.json").write_text(json.dumps(state))
    (tmp / f"rng_state_{node.node}.pth").write_bytes(f"rng {node.node} {step}".encode())
    os.replace(tmp, node.path / f"checkpoint-{step}")


def save_titan(node: NodeSync, step: int) -> None:
    (node.path / f"step-{step}").mkdir(parents=True)
    (node.path / f"step-{step}" / f"__{node.node}_0.distcp").write_bytes(os.urandom(1000))
    (node.path / f"step-{step}" / ".metadata").write_bytes(b"meta")


def five_checkpoints(c: Nodes, best: int = 20) -> NodeSync:
    """checkpoint-10 … checkpoint-50 committed (the newest names `best`), by one node."""
    writer = c.node()
    writer.restore()
    for step in (10, 20, 30, 40, 50):
        save_trainer(writer, step, best=best if step > best else None)
        settle(writer)
    assert {f"checkpoint-{s}" for s in (10, 20, 30, 40, 50)} <= c.committed()
    return writer


def listing(node: NodeSync) -> list[str]:
    return sorted(os.listdir(node.path))


# --------------------------------------------------------------------------- what is restored


def test_a_restore_brings_the_newest_checkpoint_its_best_and_every_other_unit(
    s3_uri: str, tmp_path: Path
) -> None:
    c = Nodes(tmp_path, s3_uri)
    writer = five_checkpoints(c)
    for step in (5, 10):
        save_titan(writer, step)
    for name in ("snapshot.pt", "last.ckpt", "epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"):
        (writer.path / name).write_bytes(name.encode())  # files, Lightning's among them
    (writer.path / "final").mkdir()
    (writer.path / "final" / "model.safetensors").write_bytes(b"w")
    settle(writer)
    save_trainer(writer, 60, best=20)
    writer.sync(), writer.sync(commit=False)  # uploaded, never committed: torn
    fresh = c.node()
    assert fresh.restore() == (4, 4)
    assert listing(fresh) == [
        ".mncloud-node", "checkpoint-20", "checkpoint-50", "epoch=0-step=4.ckpt",
        "epoch=1-step=8.ckpt", "final", "last.ckpt", "snapshot.pt", "step-10",
    ]  # fmt: skip
    assert fresh.left == {"checkpoint-10": "checkpoint-50", "checkpoint-30": "checkpoint-50",
                          "checkpoint-40": "checkpoint-50", "step-5": "step-10"}  # fmt: skip
    assert fresh.aside == {"checkpoint-60": "no commit marker (being written, or a node was "
                           "lost while it wrote it)"}  # fmt: skip
    for rel in ("checkpoint-50/optimizer.pt", "checkpoint-20/model.safetensors", "snapshot.pt"):
        assert (fresh.path / rel).read_bytes() == (writer.path / rel).read_bytes()
    line = restored_line(fresh, (4, 4))
    assert "left in the bucket, not restored: checkpoint-10, checkpoint-30, checkpoint-40 " \
           "(older than checkpoint-50, which the framework resumes from)" in line, line  # fmt: skip
    rows = runner.invoke(app, ["ckpt", "ls", s3_uri], env=WIDE).output.splitlines()
    row = {
        u: next(r for r in rows if f" {u}/ " in r)
        for u in ("checkpoint-20", "checkpoint-30", "checkpoint-50", "step-5")
    }
    assert "in the bucket, not restored (a restore brings checkpoint-50)" in row["checkpoint-30"]
    assert "not restored" not in row["checkpoint-20"] + row["checkpoint-50"]
    assert "in the bucket, not restored (a restore brings step-10)" in row["step-5"]


def test_folders_left_in_the_bucket_are_never_deleted_for_being_absent(
    s3_uri: str, tmp_path: Path
) -> None:
    """Two nodes sync on, one deletes a folder it restored by hand, both end cleanly: the
    folders no node restored are all still committed, every file in place."""
    c = Nodes(tmp_path, s3_uri, nodes=2)
    first = [c.node(0), c.node(1)]
    for node in first:
        node.restore()
    for step in (10, 20, 30):
        for node in first:
            save_trainer(node, step)
        settle(*first)
    before = {u: c.keys(u) for u in ("checkpoint-10", "checkpoint-20")}
    verdicts = folders.judge(c.bucket, c.prefix)
    again = [c.node(0), c.node(1)]
    for node in again:
        node.restore(verdicts)
        assert listing(node) == [".mncloud-node", "checkpoint-30"]
        (node.path / "snapshot.pt").write_bytes(b"s")
    settle(*again)
    (again[1].path / "snapshot.pt").unlink()  # by hand: not a folder a framework rotates
    settle(*again)
    for node in again:
        node.close(commit=True)
    assert {"checkpoint-10", "checkpoint-20", "checkpoint-30"} <= c.committed()
    assert {u: c.keys(u) for u in before} == before


def test_the_framework_s_rotation_takes_the_older_folders_left_in_the_bucket(
    s3_uri: str, tmp_path: Path
) -> None:
    """What the Trainer with `save_total_limit=2` does after a resume from checkpoint-50, best
    checkpoint-20: it saves 60 and deletes 50 (its oldest but the best). Had 10, 30 and 40
    been on the node it would have deleted them first: they go from the bucket with it."""
    c = Nodes(tmp_path, s3_uri)
    writer = five_checkpoints(c)
    for step in (5, 10):
        save_titan(writer, step)
    settle(writer)
    node = c.node()
    node.restore()
    save_trainer(node, 60, best=20)
    settle(node)
    assert {f"checkpoint-{s}" for s in (10, 20, 30, 40, 50, 60)} <= c.committed()
    shutil.rmtree(node.path / "checkpoint-50")
    settle(node)
    assert c.committed() == {"checkpoint-20", "checkpoint-60", "step-5", "step-10"}
    for gone in ("checkpoint-10", "checkpoint-30", "checkpoint-40", "checkpoint-50"):
        assert c.keys(gone) == [] and c.keys(f"{folders.COMMITS}/{gone}") == []
    assert node.left == {"step-5": "step-10"}  # another family: its own rotation decides
    shutil.rmtree(node.path / "step-10")
    settle(node)
    assert c.committed() == {"checkpoint-20", "checkpoint-60"}


def test_a_folder_left_in_the_bucket_and_written_anew_is_committed_afresh(
    s3_uri: str, tmp_path: Path
) -> None:
    """A script that starts over (no resume) writes checkpoint-10 again: the old marker of this
    node goes before its new files, and the new folder is committed as written."""
    c = Nodes(tmp_path, s3_uri)
    five_checkpoints(c)
    node = c.node()
    node.restore()
    assert "checkpoint-10" in node.left
    save_trainer(node, 10)
    node.sync()
    assert "checkpoint-10" not in c.committed() and "checkpoint-10" not in node.left
    node.sync()
    assert "checkpoint-10" in c.committed()
    got = c.bucket.get_bytes(join_key(c.prefix, "checkpoint-10", "model.safetensors"))
    assert got == (node.path / "checkpoint-10" / "model.safetensors").read_bytes()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", ["short", "missing", "hash"])
def test_a_bad_file_mid_restore_refuses_the_newest_and_the_next_older_comes(
    s3_uri: str, tmp_path: Path, bad: str
) -> None:
    """The bucket changes between the look and the fetch (a short object, one gone, other
    bytes of the same size): checkpoint-50 is refused with the file and range named,
    checkpoint-40 restored instead, nothing of 50 left on the node."""
    c = Nodes(tmp_path, s3_uri)
    five_checkpoints(c, best=50)
    verdicts = folders.judge(c.bucket, c.prefix)
    key = join_key(c.prefix, "checkpoint-50", "optimizer.pt")
    good = c.bucket.get_bytes(key)
    if bad == "short":
        c.bucket.put_bytes(key, good[:100])
        why = f"optimizer.pt: bytes 0-{len(good) - 1} returned 100 of {len(good)}"
    elif bad == "missing":
        c.bucket.delete(key)
        why = f"optimizer.pt: missing from the bucket (read of bytes 0-{len(good) - 1})"
    else:
        c.bucket.put_bytes(key, bytes(len(good)))
        why = "optimizer.pt fails its content hash (xxh3_128 "
    node = c.node()
    assert node.restore(verdicts) == (1, 0)
    assert listing(node) == [".mncloud-node", "checkpoint-40"]
    assert node.aside["checkpoint-50"].startswith(f"refused: checkpoint-50/{why}")
    assert node.left == {f"checkpoint-{s}": "checkpoint-40" for s in (10, 20, 30)}
    v = next(v for v in folders.judge(c.bucket, c.prefix) if v.name == "checkpoint-50")
    assert not v.committed and v.reason.startswith(f"refused: checkpoint-50/{why}")


def test_ranges_in_parallel_land_whole_and_are_hashed_in_order(
    s3_env: S3Server, tmp_path: Path
) -> None:
    bucket, _ = open_bucket(f"s3://{s3_env.make_bucket()}", retry_seconds=5)
    from mncloud.storage.folders import hash_file
    from mncloud.storage.transfer import Want

    sizes = {"empty": 0, "one": 1, "under": 999, "exact": 1000, "over": 1001, "big": 7777}
    wants = []
    for name, size in sizes.items():
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_bytes(os.urandom(size))
        bucket.put_file(name, tmp_path / "src" / name)
        wants.append(Want(name, tmp_path / "out" / name, size, name))
    digests = fetch(bucket, wants, workers=3, chunk=1000)
    for name in sizes:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()
        assert digests[name] == hash_file(tmp_path / "src" / name)
    bucket.put_bytes("big", (tmp_path / "src" / "big").read_bytes()[:3500])
    with pytest.raises(BadObject) as short:  # the first short range the workers meet
        fetch(bucket, wants, workers=3, chunk=1000)
    said = re.fullmatch(r"big: bytes (\d+)-(\d+) returned (\d+) of (\d+)", str(short.value))
    assert said, short.value
    first, last, got, asked = map(int, said.groups())
    assert first >= 3000 and asked == min(last, 7776) - first + 1 and got == max(0, 3500 - first)


def test_a_folder_file_streams_to_s3_in_parts_hashed_as_read(
    s3_env: S3Server, tmp_path: Path
) -> None:
    from mncloud.storage.folders import hash_file

    bucket, _ = open_bucket(f"s3://{s3_env.make_bucket()}", retry_seconds=5)
    assert isinstance(bucket, S3Bucket)
    path = tmp_path / "shard"
    path.write_bytes(os.urandom(2 * PART + 12345))  # three parts
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = put_stream(bucket, "shard", fd, path.stat().st_size, workers=2)
    finally:
        os.close(fd)
    assert digest == hash_file(path)
    assert bucket.get_bytes("shard") == path.read_bytes()


# --------------------------------------------------------------------------- the disk


def _namespaced() -> bool:
    """Can this machine mount a tmpfs in a user and mount namespace of our own?"""
    try:
        done = subprocess.run(["unshare", "-Urm", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _on_tmpfs(mount: Path, mb: int, cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`cmd` (shell) with a `mb` MB tmpfs mounted at `mount`, seen by it and its children."""
    if not _namespaced():
        pytest.skip("no user namespaces here: a small tmpfs cannot be mounted for the test")
    mount.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={mb}m tmpfs "{mount}" || exit 99\n{cmd}'
    return subprocess.run(["unshare", "-Urm", "sh", "-c", script], env=env, text=True,
                          capture_output=True, timeout=300)  # fmt: skip


def _one_unit(c: Nodes, mb: int) -> None:
    writer = c.node()
    writer.restore()
    save_trainer(writer, 10, size=mb * 10**6 // 3)
    settle(writer)


@pytest.mark.parametrize("mb", [2, 8])
def test_a_cloud_node_with_too_little_disk_says_so_in_one_line_and_exits_2(
    s3_env: S3Server, s3_uri: str, tmp_path: Path, mb: int
) -> None:
    """The VM's process restoring onto a 70 MB tmpfs: a 2 MB checkpoint fits (with the
    64 MiB reserve), an 8 MB one does not: one line naming both sizes and the path, exit 2,
    the node's refusal left for the run script, and nothing fetched (counted at the server)."""
    c = Nodes(tmp_path, s3_uri)
    _one_unit(c, mb)
    mount, refused, found = tmp_path / "disk", tmp_path / "refused", tmp_path / "found"
    with ByteCountingProxy(s3_env.port) as proxy:
        env = {**os.environ, **s3_env.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
               "MNCLOUD_REFUSED_MARKER": str(refused)}  # fmt: skip
        done = _on_tmpfs(mount, 70, (
            f"{sys.executable} -m mncloud.storage.foldersync restore --dir {mount}/ckpt "
            f"--uri {layout.ckpt_dir_uri(s3_uri)} --node 0 --nodes 1; rc=$?\n"
            f"find {mount}/ckpt -type f | sort > {found}; exit $rc"
        ), env)  # fmt: skip
    files = found.read_text().split()
    if mb == 2:
        assert done.returncode == 0, done.stderr
        assert f"{mount}/ckpt/checkpoint-10/optimizer.pt" in files
        assert proxy.served > mb * 10**6 * 0.9
        return
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.match(
        rf"mncloud: --ckpt-dir {mount}/ckpt has 7\d\.\d MB free: too little to "
        r"restore 8\.0 MB \(checkpoint-10\) with 67\.1 MB to spare; nothing was "
        r"downloaded: give the nodes more disk \(--disk-size\)$",
        lines[0],
    ), lines
    assert refused.read_text().strip() == lines[0].removeprefix("mncloud: ")
    assert files == [f"{mount}/ckpt/.mncloud-node"]
    assert proxy.served < 100_000, proxy.served  # the listing and the markers: no file


@pytest.mark.slow
@pytest.mark.catalog
def test_a_local_run_with_too_little_disk_fails_in_one_line_not_retried(
    s3_env: S3Server, tmp_path: Path, project: Path
) -> None:
    """`mncloud up` on 2 local nodes whose run folder is a 70 MB tmpfs, the bucket holding a
    committed 8 MB checkpoint of the run: 2 × 8 MB and the reserve do not fit. The run fails
    with the one line, as a refusal (no retry), and no node fetched a byte of it."""
    bucket = f"s3://{s3_env.make_bucket()}/exp"
    _one_unit(Nodes(tmp_path, f"{bucket}/tiny"), 8)
    run = layout.run_dir("tiny")
    out = tmp_path / "out"
    out.mkdir()
    with ByteCountingProxy(s3_env.port) as proxy:
        env = {**os.environ, **s3_env.env(), "AWS_ENDPOINT_URL": proxy.endpoint, **WIDE}
        up = [sys.executable, "-m", "mncloud", "up", str(project / "train.py"), "--cloud",
              "local", "--name", "tiny", "--yes", "--nodes", "2", "--gpus", "cpu:1",
              "--ckpt-dir", "/ckpt", "--bucket", bucket, "--no-preflight"]  # fmt: skip
        done = _on_tmpfs(run, 70, (
            f"{' '.join(up)} > {out}/up.txt 2>&1; echo $? > {out}/rc\n"
            f"cp {run}/state.json {run}/run.log {out}/; find {run}/nodes -type f > {out}/found"
        ), env)  # fmt: skip
        assert done.returncode == 0, done.stderr
    said = (out / "up.txt").read_text()
    assert (out / "rc").read_text().strip() == "1", said
    state: dict[str, Any] = json.loads((out / "state.json").read_text())
    assert state["state"] == "FAILED" and state["refused"] and state["restarts"] == 0, state
    assert state["detail"].startswith(f"failed: --ckpt-dir {run}/nodes has "), state
    assert "too little to restore 16.0 MB (checkpoint-10 on each of 2 local node(s))" in said
    assert (
        "nothing was downloaded: free space on this machine's disk (refused: not retried)" in said
    )
    assert not [f for f in (out / "found").read_text().split() if "checkpoint-10" in f]
    assert proxy.served < 100_000, proxy.served


# --------------------------------------------------------------------------- the real Trainer


@pytest.mark.slow
def test_the_real_trainer_resumes_from_the_restored_newest_and_rotates_the_bucket_with_it(
    s3_uri: str, tmp_path: Path
) -> None:
    """A Trainer saves checkpoint-1 … 5 into a synced folder (keeping all), naming an old one
    best (`greater_is_better=True` on the loss: the worst, on purpose, so best ≠ newest). A
    new node restores the newest and that best only; a Trainer with `save_total_limit=2`
    resumes from it and trains to step 8: the bucket ends holding what the node holds, the
    best and the newest, as an uninterrupted run's would."""
    transformers = pytest.importorskip("transformers")
    from transformers.trainer_utils import get_last_checkpoint

    c = Nodes(tmp_path, s3_uri)

    def train(node: NodeSync, steps: int, limit: int | None) -> Any:
        import torch

        transformers.set_seed(0)
        config = transformers.GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1,
                                         n_head=1)  # fmt: skip
        ids = torch.arange(8).repeat(8, 1)
        data = [{"input_ids": row, "labels": row} for row in ids]
        args = transformers.TrainingArguments(
            output_dir=str(node.path), max_steps=steps, save_steps=1, eval_strategy="steps",
            eval_steps=1, metric_for_best_model="loss", greater_is_better=True,
            save_total_limit=limit, per_device_train_batch_size=2, use_cpu=True,
            report_to=[], seed=0, disable_tqdm=True,
        )  # fmt: skip

        class Sync(transformers.TrainerCallback):
            def on_save(self, *_args: Any, **_kw: Any) -> None:
                node.sync(final=True)  # each save (after the Trainer's rotation) goes up

        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
            eval_dataset=data[:2], callbacks=[Sync()],
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=get_last_checkpoint(str(node.path)))
        return trainer

    first = c.node()
    first.restore()
    train(first, 5, None)
    assert {f"checkpoint-{s}" for s in range(1, 6)} == c.committed()
    state = json.loads((first.path / "checkpoint-5" / "trainer_state.json").read_text())
    best = Path(state["best_model_checkpoint"]).name
    assert best != "checkpoint-5", state  # the test's premise: an older best
    node = c.node()
    node.restore()
    assert listing(node) == sorted([".mncloud-node", best, "checkpoint-5"])
    trainer = train(node, 8, 2)
    assert trainer.state.global_step == 8 and Path(trainer.state.best_model_checkpoint).name == best
    node.close(commit=True)
    kept = sorted(e for e in os.listdir(node.path) if e.startswith("checkpoint-"))
    assert kept == sorted([best, "checkpoint-8"])
    assert c.committed() == set(kept)
