"""`--ckpt-dir` checkpoint folders committed as a whole (storage/folders.py, foldersync.py),
against the real S3 server: a folder counts only once every node's marker is up and every file
it names is there at its size; restore never shows a torn or corrupt folder to the script, keeps
it in the bucket and names it in `ckpt ls`; a plain `os.replace` file works as before; the
cloud's sync process, as a process; the run script that starts it; chaos's `--during-save`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import constants, layout
from mncloud.backends.local.chaos import _saving_folders
from mncloud.backends.local.ckptdir import NodeFolder
from mncloud.backends.local.state import LocalLaunch
from mncloud.cli import app
from mncloud.operate.status import newest_ckpt_dir_entry
from mncloud.storage import folders, join_key, open_bucket
from mncloud.storage.foldersync import NodeSync, local_files
from tests.servers import S3Server
from tests.test_local import wait_until

runner = CliRunner()
WIDE = {"COLUMNS": "250"}
HF_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")


class Cluster:
    """`nodes` node folders syncing one run's `ckpt-dir` in the real S3 server."""

    def __init__(self, root: Path, uri: str, nodes: int = 2):
        self.root, self.uri, self.nodes = root, uri, nodes
        self.bucket, self.prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
        self.attempt = 0
        self.node: list[NodeSync] = []
        self.start()

    def start(self) -> list[NodeSync]:
        """A new attempt: fresh disks, restored from the bucket."""
        self.attempt += 1
        self.node = [self._node(self.root / f"a{self.attempt}" / f"node-{n}", n)
                     for n in range(self.nodes)]  # fmt: skip
        verdicts = folders.judge(self.bucket, self.prefix)
        for node in self.node:
            node.restore(verdicts)
        return self.node

    def _node(self, path: Path, n: int) -> NodeSync:
        return NodeSync(path, path.with_suffix(".up"), self.bucket, self.prefix, n, self.nodes, set)

    def fresh(self, n: int) -> NodeSync:
        """A node of a relaunch, restored, beside the running ones."""
        node = self._node(self.root / f"fresh-{uuid.uuid4().hex[:6]}", n)
        node.restore()
        return node

    def settle(self, *nodes: int) -> None:
        for n in nodes or range(self.nodes):
            self.node[n].sync(), self.node[n].sync()

    def verdict(self, name: str) -> folders.Verdict:
        found = [v for v in folders.judge(self.bucket, self.prefix) if v.name == name]
        return found[0] if found else folders.Verdict(name, True, False, "not in the bucket")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"


def save_hf(node: NodeSync, step: int) -> None:
    """What a Trainer's rank writes: node 0 the shared files, every node its RNG state, into
    `tmp-checkpoint-N`, renamed onto `checkpoint-N` when the save ends."""
    tmp = node.path / f"tmp-checkpoint-{step}"
    tmp.mkdir(parents=True)
    if node.node == 0:
        for name in HF_FILES:
            (tmp / name).write_bytes(f"{name} {step}".encode() + bytes(64))
    (tmp / f"rng_state_{node.node}.pth").write_bytes(f"rng {node.node} {step}".encode())
    os.replace(tmp, node.path / f"checkpoint-{step}")


@pytest.fixture
def s3_uri(s3_env: S3Server) -> str:
    return f"s3://{s3_env.make_bucket()}/exp/run"


def test_a_folder_of_two_nodes_commits_only_when_both_arrived(s3_uri: str, tmp_path: Path) -> None:
    c = Cluster(tmp_path, s3_uri)
    save_hf(c.node[0], 200)
    c.node[0].sync()
    assert "tmp-checkpoint-200" not in str(local_files(c.node[0].path))  # never synced
    c.settle(0)
    assert c.verdict("checkpoint-200").reason == "no marker from node 1 (of 2)"
    fresh = c.fresh(1)  # a relaunch now: node 1's files never came
    assert not (fresh.path / "checkpoint-200").exists()
    assert fresh.aside == {"checkpoint-200": "no marker from node 1 (of 2)"}
    save_hf(c.node[1], 200)
    c.node[0].sync(), c.settle(1)
    v = c.verdict("checkpoint-200")
    assert v.committed and sorted(v.files) == sorted(
        [*HF_FILES, "rng_state_0.pth", "rng_state_1.pth"]
    )
    for node in c.start():  # the union comes back to every node
        assert sorted(os.listdir(node.path / "checkpoint-200")) == sorted(v.files)
        assert (node.path / "checkpoint-200" / "rng_state_1.pth").read_bytes() == b"rng 1 200"


def _committed_pair(c: Cluster) -> None:
    """checkpoint-200 and checkpoint-400, both committed by both nodes."""
    for step in (200, 400):
        for node in c.node:
            save_hf(node, step)
        c.settle()
    assert c.verdict("checkpoint-400").committed


@pytest.mark.parametrize("tear", ["missing", "short", "no marker"])
def test_a_planted_partial_folder_is_never_shown_and_ls_names_it(
    s3_uri: str, tmp_path: Path, tear: str
) -> None:
    c = Cluster(tmp_path, s3_uri)
    _committed_pair(c)
    key = c.key("checkpoint-400/optimizer.pt")
    if tear == "missing":
        c.bucket.delete(key)
        reason = "optimizer.pt missing"
    elif tear == "short":
        c.bucket.put_bytes(key, c.bucket.get_bytes(key)[:10])
        reason = "optimizer.pt is 10 B, its marker says"
    else:
        for n in range(2):
            c.bucket.delete(folders.marker_key(c.prefix, "checkpoint-400", n))
        reason = "no commit marker"
    assert reason in c.verdict("checkpoint-400").reason
    for node in c.start():
        assert sorted(os.listdir(node.path)) == [".mncloud-node", "checkpoint-200"]
        assert reason in node.aside["checkpoint-400"]
    assert c.bucket.exists(c.key("checkpoint-400/model.safetensors"))  # kept, never deleted
    listing = runner.invoke(app, ["ckpt", "ls", s3_uri], env=WIDE)
    assert listing.exit_code == 0, listing.output
    row = next(line for line in listing.output.splitlines() if "checkpoint-400/" in line)
    assert "incomplete" in row and reason.split()[0] in row
    assert "yes" in next(line for line in listing.output.splitlines() if "checkpoint-200/" in line)
    assert newest_ckpt_dir_entry(s3_uri) == ("checkpoint-200", 200)  # the summary's, not the torn


def test_a_hash_mismatch_is_refused_with_file_and_folder_named_and_the_older_used(
    s3_uri: str, tmp_path: Path
) -> None:
    c = Cluster(tmp_path, s3_uri)
    _committed_pair(c)
    key = c.key("checkpoint-400/optimizer.pt")
    good = c.bucket.get_bytes(key)
    c.bucket.put_bytes(key, bytes(len(good)))  # same size, other bytes: only the hash sees it
    assert c.verdict("checkpoint-400").committed  # by sizes; the restore reads the content
    nodes = c.start()
    for node in nodes:
        assert sorted(os.listdir(node.path)) == [".mncloud-node", "checkpoint-200"]
        why = node.aside["checkpoint-400"]
        assert why.startswith("refused: checkpoint-400/optimizer.pt fails its content hash"), why
    assert c.bucket.get_bytes(key) == bytes(len(good))  # kept as it is, for a person to see
    v = c.verdict("checkpoint-400")  # refused.json: ls and status say so from now on
    assert not v.committed and "checkpoint-400/optimizer.pt fails its content hash" in v.reason
    listing = runner.invoke(app, ["ckpt", "ls", s3_uri], env=WIDE).output
    assert "fails its content hash" in listing
    for node in nodes:  # the script resumes from 200 and saves 400 afresh: committed again
        save_hf(node, 400)
    c.settle()
    assert c.verdict("checkpoint-400").committed
    assert c.bucket.get_bytes(key) == good


def test_a_plain_file_written_with_os_replace_works_as_before(s3_uri: str, tmp_path: Path) -> None:
    c = Cluster(tmp_path, s3_uri, nodes=2)
    snap = c.node[0].path / "snapshot.pt"
    (c.node[0].path / "snapshot.pt.tmp").write_bytes(b"epoch 3")
    os.replace(c.node[0].path / "snapshot.pt.tmp", snap)
    c.settle()
    assert c.bucket.get_bytes(c.key("snapshot.pt")) == b"epoch 3"
    records = [o.key for o in c.bucket.list(f"{c.prefix}/{folders.COMMITS}/")]
    assert records == [folders.marker_key(c.prefix, "snapshot.pt", 0)]  # its size and hash
    v = c.verdict("snapshot.pt")
    assert v.committed and not v.folder
    assert v.files == {"": (7, {folders.hash_file(snap)})}
    for node in c.start():  # node 1 never wrote it; a file reaches every node, as before
        assert (node.path / "snapshot.pt").read_bytes() == b"epoch 3"
    c.node[0].path.joinpath("snapshot.pt").unlink()  # deleted by the script: records go too
    c.settle()
    assert not c.bucket.list(f"{c.prefix}/")


def test_a_file_without_a_record_is_restored_by_its_size_as_before(
    s3_uri: str, tmp_path: Path
) -> None:
    """Uploaded before mncloud recorded files (or the cloud's MOUNT_CACHED fallback)."""
    c = Cluster(tmp_path, s3_uri, nodes=1)
    c.bucket.put_bytes(c.key("snapshot.pt"), b"epoch 3")
    v = c.verdict("snapshot.pt")
    assert v.committed and v.files == {"": (7, set())}
    assert (c.start()[0].path / "snapshot.pt").read_bytes() == b"epoch 3"


def _lightning_files(c: Cluster) -> None:
    """What Lightning's rank 0 leaves on node 0: the newest epoch's file, then `last.ckpt`."""
    node = c.node[0]
    (node.path / "epoch=1-step=8.ckpt").write_bytes(b"step 8 " + bytes(100))
    (node.path / "last.ckpt").write_bytes(b"step 8 " + bytes(100))
    c.settle()


def test_a_top_level_file_changed_in_the_bucket_is_refused_kept_and_named(
    s3_uri: str, tmp_path: Path
) -> None:
    """The same size, 64 bytes flipped: only its recorded hash sees it. It is not restored,
    stays in the bucket as it is, and the restore line, `ckpt ls` and `status`'s view name
    it; Lightning's `last.ckpt` gets the newest `epoch=…` file's copy in its place."""
    from mncloud.operate.status import ckpt_dir_view
    from mncloud.storage.foldersync import restored_line

    c = Cluster(tmp_path, s3_uri)
    _lightning_files(c)
    key = c.key("last.ckpt")
    good = c.bucket.get_bytes(key)
    bad = good[:32] + bytes(b ^ 0xFF for b in good[32:96]) + good[96:]
    c.bucket.put_bytes(key, bad)
    assert c.verdict("last.ckpt").committed  # by its size; the restore reads the content
    nodes = c.start()
    for node in nodes:
        why = node.aside["last.ckpt"]
        assert why.startswith("refused: last.ckpt fails its content hash (xxh3_128 "), why
        assert node.stand_ins == {"last.ckpt": "epoch=1-step=8.ckpt"}
        assert (node.path / "last.ckpt").read_bytes() == good  # the epoch file's bytes
        line = restored_line(node, (0, 1))
        assert "kept aside: last.ckpt (refused: last.ckpt fails its content hash" in line, line
        assert "last.ckpt is a copy of epoch=1-step=8.ckpt" in line, line
        c.settle()
    assert c.bucket.get_bytes(key) == bad  # kept as it is: the stand-in is never uploaded
    v = c.verdict("last.ckpt")
    assert not v.committed and "last.ckpt fails its content hash" in v.reason
    listing = runner.invoke(app, ["ckpt", "ls", s3_uri], env=WIDE).output
    row = next(line for line in listing.splitlines() if " last.ckpt " in line)
    assert "refused: last.ckpt fails its content hash" in row, listing
    assert "a copy of epoch=1-step=8.ckpt in its place" in row, listing
    assert "newest committed checkpoint: epoch=1-step=8.ckpt (step 8)" in listing
    assert "no checkpoints at" not in listing  # one coherent answer
    view = ckpt_dir_view(s3_uri)
    assert view.newest == "epoch=1-step=8.ckpt"
    assert [u["name"] for u in view.incomplete] == ["last.ckpt"]
    (nodes[0].path / "last.ckpt").write_bytes(b"step 12 " + bytes(99))  # Lightning saves again
    c.settle()
    assert c.verdict("last.ckpt").committed  # recorded afresh: restored from now on
    assert c.bucket.get_bytes(key) == b"step 12 " + bytes(99)


def test_a_refused_last_ckpt_without_an_epoch_file_starts_afresh(
    s3_uri: str, tmp_path: Path
) -> None:
    c = Cluster(tmp_path, s3_uri, nodes=1)
    (c.node[0].path / "last.ckpt").write_bytes(b"step 8 " + bytes(100))
    c.settle()
    c.bucket.put_bytes(c.key("last.ckpt"), b"step 9 " + bytes(100))
    node = c.start()[0]
    assert "last.ckpt" in node.aside and node.stand_ins == {}
    assert sorted(os.listdir(node.path)) == [".mncloud-node"]


def test_a_log_folder_is_synced_file_by_file_and_never_torn(s3_uri: str, tmp_path: Path) -> None:
    """Lightning's `lightning_logs/` (written by rank 0 only, under `default_root_dir`): its
    files go up as they settle, its marker only at a clean end; never incomplete, restored
    file by file (one that fails its marker is left in the bucket, named)."""
    c = Cluster(tmp_path, s3_uri)
    logs = c.node[0].path / "lightning_logs" / "version_0"
    logs.mkdir(parents=True)
    (logs / "metrics.csv").write_text("step,loss\n1,0.5\n")
    (logs / "hparams.yaml").write_text("lr: 0.01\n")
    c.settle()
    assert c.bucket.exists(c.key("lightning_logs/version_0/metrics.csv"))
    assert not c.bucket.list(f"{c.prefix}/{folders.COMMITS}/")  # no marker while it runs
    v = c.verdict("lightning_logs")
    assert v.committed and v.log and not v.reason
    assert c.node[0].pending() == []  # logs are no save for chaos's --during-save
    listing = runner.invoke(app, ["ckpt", "ls", s3_uri], env=WIDE).output
    assert "incomplete" not in listing and "yes (logs" in listing, listing
    for node in c.node:
        node.close(commit=True)
    markers = [o.key for o in c.bucket.list(f"{c.prefix}/{folders.COMMITS}/")]
    assert markers == [folders.marker_key(c.prefix, "lightning_logs", 0)]  # node 1 wrote none
    assert c.verdict("lightning_logs").files["version_0/metrics.csv"][1]
    c.bucket.put_bytes(c.key("lightning_logs/version_0/metrics.csv"), b"step,loss\n1,0.9\n")
    for node in c.start():
        assert (node.path / "lightning_logs" / "version_0" / "hparams.yaml").exists()
        assert not (node.path / "lightning_logs" / "version_0" / "metrics.csv").exists()
        why = node.aside["lightning_logs/version_0/metrics.csv"]
        assert "metrics.csv fails its content hash" in why, why
    assert c.bucket.exists(c.key("lightning_logs/version_0/metrics.csv"))  # kept
    assert c.verdict("lightning_logs").committed


def test_a_log_file_held_open_and_growing_goes_up_as_it_is_every_few_seconds(
    s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard's event file is held open for writing and appended at every step: never
    settled, it went up only at the end, and a preemption lost every step. A logger's file is
    now sent as it is, at most every `LOG_SNAPSHOT_S` (on a fake clock here); a checkpoint's
    file held open still waits until it settles."""
    from mncloud.storage import foldersync

    now = [1000.0]
    monkeypatch.setattr(foldersync, "time", type("Clock", (), {"monotonic": lambda: now[0]}))
    c = Cluster(tmp_path, s3_uri, nodes=1)
    event = c.node[0].path / "tensorboard" / "run" / "events.out.tfevents.1"
    held = c.node[0].path / "checkpoint-5" / "model.pt"
    for path in (event, held):
        path.parent.mkdir(parents=True)
    node = NodeSync(c.node[0].path, tmp_path / "up", c.bucket, c.prefix, 0, 1,
                    lambda: {os.path.realpath(event), os.path.realpath(held)})  # fmt: skip
    key = c.key("tensorboard/run/events.out.tfevents.1")
    event.write_bytes(b"step 1;")
    held.write_bytes(b"weights")
    node.sync()
    assert c.bucket.get_bytes(key) == b"step 1;"  # held and unsettled, sent all the same
    assert not c.bucket.exists(c.key("checkpoint-5/model.pt"))  # a checkpoint's: never so
    with event.open("ab") as f:
        f.write(b"step 2;")
    now[0] += foldersync.LOG_SNAPSHOT_S - 1
    node.sync(), node.sync()
    assert c.bucket.get_bytes(key) == b"step 1;"  # not again before LOG_SNAPSHOT_S
    with event.open("ab") as f:
        f.write(b"step 3;")
    now[0] += 1
    node.sync()
    assert c.bucket.get_bytes(key) == b"step 1;step 2;step 3;"
    assert not c.bucket.exists(c.key("checkpoint-5/model.pt"))
    with event.open("ab") as f:
        f.write(b"step 4;")
    (c.node[0].path / "epoch=0-step=4.ckpt").write_bytes(b"saved at 4")
    node.sync(), node.sync()  # the checkpoint settles: the log goes up first, not yet due
    assert c.bucket.get_bytes(key) == b"step 1;step 2;step 3;step 4;"
    assert c.bucket.exists(c.key("epoch=0-step=4.ckpt"))
    for fresh in c.start():  # a preemption: no end of the attempt, the snapshot restored
        assert (fresh.path / "tensorboard/run/events.out.tfevents.1").read_bytes() == (
            b"step 1;step 2;step 3;step 4;"
        )


def test_a_changed_folder_stops_counting_before_its_new_files_go_up(
    s3_uri: str, tmp_path: Path
) -> None:
    c = Cluster(tmp_path, s3_uri, nodes=1)
    save_hf(c.node[0], 200)
    c.settle()
    assert c.verdict("checkpoint-200").committed
    (c.node[0].path / "checkpoint-200" / "optimizer.pt").write_bytes(b"rewritten")
    assert c.node[0].sync() == []  # first seen: not uploaded yet, but the marker is gone
    assert c.verdict("checkpoint-200").reason.startswith("no commit marker")
    c.node[0].sync()
    assert c.verdict("checkpoint-200").committed
    assert c.node[0].pending() == []


def test_announced_folders_wait_for_saved_and_a_crash_leaves_them_uncommitted(
    s3_uri: str, tmp_path: Path
) -> None:
    c = Cluster(tmp_path, s3_uri, nodes=1)
    node = c.node[0]
    folders.announce(node.path)
    (node.path / "step-10").mkdir()
    (node.path / "step-10" / "__0_0.distcp").write_bytes(b"shard")
    c.settle()
    assert node.pending() == ["step-10/"]
    assert c.verdict("step-10").reason.startswith("no commit marker")
    (node.path / "step-10" / ".metadata").write_bytes(b"meta")
    folders.saved(node.path / "step-10", node.path)
    c.settle()
    assert c.verdict("step-10").committed
    (node.path / "step-20").mkdir()
    (node.path / "step-20" / "__0_0.distcp").write_bytes(b"half")
    folders.saved("step-20", node.path)
    node.close(commit=False)  # the node crashed: uploaded, never committed
    assert c.bucket.exists(c.key("step-20/__0_0.distcp"))
    assert not c.verdict("step-20").committed


def test_a_clean_exit_gives_a_folder_it_never_held_an_empty_marker(
    s3_uri: str, tmp_path: Path
) -> None:
    """A folder only node 0 writes commits when node 1 ends cleanly (see folders.py)."""
    c = Cluster(tmp_path, s3_uri)
    (c.node[0].path / "best").mkdir()
    (c.node[0].path / "best" / "model.pt").write_bytes(b"w")
    c.settle()
    assert c.verdict("best").reason == "no marker from node 1 (of 2)"
    c.node[1].close(commit=True)
    assert c.verdict("best").committed


def test_a_local_node_says_which_folder_it_is_saving(s3_uri: str, tmp_path: Path) -> None:
    """What chaos's `--during-save` waits for on a `--ckpt-dir` run."""
    launch = LocalLaunch(
        name="r", token="t0", task_id="task", workdir=str(tmp_path), run="true",
        num_nodes=2, procs_per_node=1, master_port=29500, ckpt_uri=s3_uri,
    )  # fmt: skip
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(s3_uri), retry_seconds=5)
    folder = tmp_path / "run"
    node = NodeFolder(folder, launch, 1, bucket, prefix)
    node.restore()
    (node.path / "tmp-checkpoint-5").mkdir()
    node.sync()
    assert _saving_folders(folder, 1) == ["tmp-checkpoint-5/"]
    os.replace(node.path / "tmp-checkpoint-5", node.path / "checkpoint-5")
    (node.path / "checkpoint-5" / "rng_state_1.pth").write_bytes(b"r")
    (node.path / "epoch=0-step=5.ckpt").write_bytes(b"lightning")  # a plain file: one upload
    node.sync()
    assert _saving_folders(folder, 1) == ["checkpoint-5/", "epoch=0-step=5.ckpt"]
    node.sync()
    assert _saving_folders(folder, 1) == []
    (node.path / "epoch=0-step=5.ckpt").write_bytes(b"lightning, saved again")
    node.sync()
    assert _saving_folders(folder, 1) == ["epoch=0-step=5.ckpt"]


def _local_run(tmp_path: Path, s3_uri: str, nodes: int) -> tuple[Path, LocalLaunch]:
    """A local run's folder (its launch saved, as `up` leaves it) over `s3_uri`."""
    from mncloud.backends.local.state import save_launch

    launch = LocalLaunch(
        name="r", token=f"t{uuid.uuid4().hex[:8]}", task_id="task", workdir=str(tmp_path),
        run="true", num_nodes=nodes, procs_per_node=1, master_port=29500, ckpt_uri=s3_uri,
    )  # fmt: skip
    folder = tmp_path / "run"
    folder.mkdir()
    save_launch(folder, launch)
    return folder, launch


def _tagged_sleeper(token: str, node: int) -> subprocess.Popen[bytes]:
    """A process of `node` of a local run, found by its env tag as the node's ranks are."""
    from mncloud.backends.local.processes import node_tag

    env = {**os.environ, constants.LOCAL_NODE_TAG_ENV: node_tag(token, node)}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)


def test_a_preempted_local_node_loses_its_disk_with_it(s3_uri: str, tmp_path: Path) -> None:
    """chaos's kill and the node's folder vanish together: what the node had not uploaded by
    then never reaches the bucket (a VM's disk), until the next attempt's fresh folder."""
    from mncloud.backends.local.chaos import preempt_node

    folder, launch = _local_run(tmp_path, s3_uri, 2)
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(s3_uri), retry_seconds=5)
    node = NodeFolder(folder, launch, 1, bucket, prefix)
    node.restore()
    (node.path / "checkpoint-5").mkdir()
    (node.path / "checkpoint-5" / "rng_state_1.pth").write_bytes(b"r")
    node.sync()  # seen once: the next scan would upload and commit it
    rank = _tagged_sleeper(launch.token, 1)
    record = preempt_node(folder, 1, during_save=True, save_timeout=30)
    assert rank.wait(timeout=30) == -signal.SIGKILL
    assert record["pids"] == [rank.pid] and record["during_save_step"] == "checkpoint-5/"
    assert "while it saved checkpoint-5/ (SIGKILL)" in record["message"], record
    assert node.sync() == [] and node.sync() == []
    assert not bucket.exists(join_key(prefix, "checkpoint-5/rng_state_1.pth"))
    node.restore()  # the next attempt: a fresh disk that syncs again
    (node.path / "snapshot.pt").write_bytes(b"s")
    node.sync()
    assert node.sync() == ["snapshot.pt"]


def test_a_replaced_node_gets_its_folder_afresh_from_the_bucket(
    s3_uri: str, tmp_path: Path
) -> None:
    """Node recovery: the preempted node's disk is gone; its replacement (a new VM) starts from
    the bucket's committed folders and syncs again."""
    from mncloud.backends.local.ckptdir import CkptDirSync, lose_disk

    folder, launch = _local_run(tmp_path, s3_uri, 2)
    sync = CkptDirSync(folder, launch, lambda _line: None)
    for node in sync.nodes:
        node.restore()
        (node.path / "checkpoint-5").mkdir()
        (node.path / "checkpoint-5" / f"rng_state_{node.node}.pth").write_bytes(b"r")
        node.sync(), node.sync()
    replaced = sync.nodes[1]
    with lose_disk(folder, 1):
        pass  # preempted
    (replaced.path / "stray.pt").write_bytes(b"never uploaded")
    assert replaced.sync() == [] and replaced.sync() == []
    sync.replace_node(1)
    assert sorted(os.listdir(replaced.path / "checkpoint-5")) == ["rng_state_0.pth",
                                                                   "rng_state_1.pth"]  # fmt: skip
    assert not (replaced.path / "stray.pt").exists()
    (replaced.path / "snapshot.pt").write_bytes(b"s")
    replaced.sync()
    assert replaced.sync() == ["snapshot.pt"]


def test_preempting_a_node_with_nothing_running_keeps_its_disk(s3_uri: str, tmp_path: Path) -> None:
    """A node that had already ended is not lost: its folder still flushes."""
    from mncloud.backends.local.chaos import preempt_node

    folder, launch = _local_run(tmp_path, s3_uri, 1)
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(s3_uri), retry_seconds=5)
    node = NodeFolder(folder, launch, 0, bucket, prefix)
    node.restore()
    (node.path / "snapshot.pt").write_bytes(b"s")
    assert preempt_node(folder, 0)["pids"] == []
    node.sync()
    assert node.sync() == ["snapshot.pt"]


# --------------------------------------------------------------------------- the cloud


@pytest.mark.catalog
def test_the_cloud_run_script_starts_the_folder_sync(project: Path) -> None:
    from mncloud.render import render
    from mncloud.request import build_spec

    spec = build_spec(
        project / "train.py", gpus="H100:8", nodes=2, bucket="s3://team-ckpt/exp", ckpt_dir="/ckpt"
    )
    run = render(spec).config["run"]
    assert "python -m mncloud.storage.foldersync run" in run
    assert "--uri s3://team-ckpt/exp/train/ckpt-dir" in run
    assert 'ckpt_node="$NODE_RANK"; ckpt_nodes="$NNODES"' in run
    assert 'echo "$rc" > "$ckpt_sync_rc"' in run and 'kill -TERM "$ckpt_sync_pid"' in run
    assert "ckpt_target=/mncloud-bucket/exp/train/ckpt-dir" in run  # the fallback, kept
    checked = subprocess.run(["bash", "-n"], input=run, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    local = build_spec(project / "train.py", gpus="cpu:1", cloud=["local"], ckpt_dir="/ckpt")
    assert "mncloud.storage.foldersync" not in render(local).config["run"]


def test_the_cloud_sync_process_restores_commits_and_flushes(
    s3_env: S3Server, s3_uri: str, tmp_path: Path
) -> None:
    c = Cluster(tmp_path / "planted", s3_uri, nodes=1)
    save_hf(c.node[0], 100)
    c.settle()
    (c.node[0].path / "checkpoint-200").mkdir()
    (c.node[0].path / "checkpoint-200" / "model.safetensors").write_bytes(b"torn")
    c.node[0].sync(), c.node[0].sync(commit=False)  # uploaded, its marker never written
    vm = tmp_path / "vm" / "ckpt"
    ready, rc = tmp_path / "ready", tmp_path / "rc"
    env = {**os.environ, **s3_env.env()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mncloud.storage.foldersync", "run", "--dir", str(vm),
         "--uri", layout.ckpt_dir_uri(s3_uri), "--node", "0", "--nodes", "1",
         "--watch", str(os.getpid()), "--rc-file", str(rc), "--ready", str(ready)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the restore")
        assert sorted(os.listdir(vm)) == [".mncloud-node", "checkpoint-100"]
        assert ready.read_text() == "checkpoint-100"  # the run script's $MNCLOUD_RESUME_FROM
        save = vm / "checkpoint-300"
        save.mkdir()
        (save / "model.safetensors").write_bytes(b"w300")
        wait_until(lambda: c.verdict("checkpoint-300").committed, 60, "checkpoint-300 committed")
        (vm / "last.ckpt").write_bytes(b"lightning")  # flushed at the end without waiting
        rc.write_text("0\n")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "kept aside: checkpoint-200 (no commit marker" in err
    assert c.bucket.get_bytes(c.key("last.ckpt")) == b"lightning"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = subprocess.run(
        [sys.executable, "-m", "mncloud.storage.foldersync", "restore", "--dir", str(foreign),
         "--uri", layout.ckpt_dir_uri(s3_uri), "--node", "0", "--nodes", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1 and "give --ckpt-dir an empty" in refused.stderr
    assert (foreign / "notes.txt").read_text() == "mine"


def test_saved_without_a_ckpt_dir_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from mncloud.errors import StorageError

    monkeypatch.delenv(constants.CKPT_DIR_ENV, raising=False)
    with pytest.raises(StorageError, match="MNCLOUD_CKPT_DIR is not set"):
        folders.saved(f"checkpoint-{uuid.uuid4().int % 10}")


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.catalog
def test_preempted_during_a_folder_save_resumes_from_the_folder_before_it(
    s3_env: S3Server, tmp_path: Path
) -> None:
    """2 local nodes write Trainer-shaped folders; node 1 is killed while it saves the second:
    both nodes resume from the first, the torn one is kept aside and named, never loaded."""
    from mncloud.backends.base import RunState
    from tests.test_local import cli, run_log, state_of, up, wait_final

    script = Path(__file__).parent / "data" / "hf_shaped_saves.py"
    bucket = f"s3://{s3_env.make_bucket()}/exp"
    flags = ["--nodes", "2", "--gpus", "cpu:1", "--launcher", "none", "--ckpt-dir", "/ckpt",
             "--recovery-delay", "0.5s", "--bucket", bucket, "--no-preflight"]  # fmt: skip
    up("hfsave", script, *flags, script_args=["120", "40", "0.3", "0.1"])
    c = Cluster(tmp_path, f"{bucket}/hfsave", nodes=2)
    wait_until(lambda: c.verdict("checkpoint-40").committed, 120, "checkpoint-40 committed")
    chaos = cli("chaos", "preempt", "hfsave", "--node", "1", "--during-save").output
    assert "while it saved tmp-checkpoint-80/" in chaos, chaos
    state = wait_final("hfsave", timeout=240)
    log = run_log("hfsave")
    assert state.state is RunState.SUCCEEDED and state_of("hfsave").preemptions == 1, log
    assert "node 0 resumed from checkpoint-40" in log, log
    assert "node 1 resumed from checkpoint-40" in log and "torn" not in log, log
    aside = next(line for line in log.splitlines() if "checkpoint-80 kept aside" in line)
    assert "no marker from node 1 (of 2)" in aside, aside  # node 0's share had arrived
    for step in (40, 80, 120):  # saved again after the resume: committed by both nodes
        assert c.verdict(f"checkpoint-{step}").committed
    c.bucket.delete(c.key("checkpoint-120/rng_state_1.pth"))  # torn after the end, by hand
    status = runner.invoke(app, ["status", "hfsave"], env=WIDE).output
    assert "--ckpt-dir keeps aside (incomplete, never restored): checkpoint-120" in status, status
    assert "rng_state_1.pth missing" in status
    listing = runner.invoke(app, ["ckpt", "ls", "hfsave"], env=WIDE).output
    assert "rng_state_1.pth missing" in listing, listing
