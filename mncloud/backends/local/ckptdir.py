"""`--ckpt-dir` on local nodes: a folder per node, kept in the bucket as a cloud node keeps it.

On a cloud node `--ckpt-dir` is a plain folder on the VM's disk that `python -m
mncloud.storage.foldersync run` (started by the run script) keeps in `<ckpt uri>/ckpt-dir`,
checkpoint folders committed as a whole (`storage/folders.py`): SkyPilot's MOUNT_CACHED uploads
file by file and cannot say when a folder is whole. A local node gets a plain folder
(`MNCLOUD_CKPT_DIR`, `nodes/node-N/ckpt-dir`) that the supervisor syncs with the same
`NodeSync`, in one thread for all nodes:

    attempt starts  every node's folder is made afresh and filled with what the framework
                    resumes from (a new VM; `storage/folderrestore.py`): the newest committed
                    checkpoint folder, every other committed unit; older folders stay in the
                    bucket, torn ones are kept aside there, both logged. Too little disk for
                    every node: the run fails with one line, nothing fetched, not retried
    every 0.25 s    a file that changed, has kept its size and mtime for one scan, and that no
                    process of its node holds open for writing is copied aside, checked
                    unchanged, and uploaded; a file gone from the folder is deleted; a folder
                    whose files are all up is committed by this node's marker
    node exits      (any exit code, e.g. 115 after a preemption notice) its folder is flushed,
                    as SkyPilot flushes the cache when the run script ends; its folders are
                    committed only after 0 or 115 (a crash mid-save leaves one uncommitted)
    node killed     (chaos preempt, or torn down with the cluster) its folder is dropped unsynced

Example: rank 0 calls `torch.save(state, "/ckpt/snapshot.pt.tmp")` then `os.replace` onto
`snapshot.pt` at t=10.0; the scan at 10.25 sees snapshot.pt new, at 10.5 stable and closed,
uploads it by 10.6. Node 1 is preempted at 10.55: the relaunch reads the snapshot of t=10
only if its upload had finished, else the previous one, whole either way. A Trainer's
`checkpoint-400/` on 2 nodes counts once both nodes' markers are up (see `storage/folders.py`).

While a node has a unit not yet in the bucket as it is now (a folder not committed, a plain file
not uploaded), `nodes/node-N/ckpt-dir.saving` names it, so `chaos preempt --during-save` can
strike then. Each sync pass of a node holds `nodes/node-N/ckpt-dir.lock`; chaos takes it to
preempt the node (`lose_disk`): no upload or marker of that node runs between its look at
`.saving` and the kill, and none after it (`ckpt-dir.lost`), as when a VM and its disk vanish.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from mncloud import constants, layout
from mncloud.backends.local.processes import tagged_processes
from mncloud.backends.local.state import LocalLaunch, node_ckpt_dir, node_dir
from mncloud.storage import folderrestore, open_bucket
from mncloud.storage.buckets import Bucket
from mncloud.storage.folders import judge
from mncloud.storage.foldersync import (
    CLEAN_EXITS,
    SCAN_S,
    NodeSync,
    open_for_writing,
    restored_line,
)

RETRY_S = 5.0
"""How long one bucket operation retries before the file waits for the next scan."""
SAVING_FILE = "ckpt-dir.saving"
"""In a node's folder: the `--ckpt-dir` units it is writing or uploading (for chaos)."""
LOCK_WAIT_S = 10.0
"""How long chaos waits for a node's sync pass before it kills the node anyway."""
LOST_FILE = "ckpt-dir.lost"
"""In a node's folder: the node was preempted; its disk is gone until the next attempt."""


def saving_path(folder: Path, node: int) -> Path:
    return node_dir(folder, node) / SAVING_FILE


def sync_lock(folder: Path, node: int) -> FileLock:
    """Held by each sync pass of `node` (and by chaos while it preempts the node)."""
    return FileLock(node_dir(folder, node) / "ckpt-dir.lock")


@contextlib.contextmanager
def lose_disk(folder: Path, node: int) -> Iterator[Callable[[], None]]:
    """Preempt `node`'s disk: inside the block no sync pass of the node runs; from its start
    the node's folder is never synced again this attempt, unless the block calls the function
    it yields (the node turned out to have nothing to lose, e.g. it had already exited)."""
    lost = node_dir(folder, node) / LOST_FILE
    lock = sync_lock(folder, node)
    with contextlib.suppress(Timeout):  # a pass stuck on an unreachable bucket: kill anyway
        lock.acquire(timeout=LOCK_WAIT_S)
    try:
        lost.parent.mkdir(parents=True, exist_ok=True)
        lost.touch()
        yield lambda: lost.unlink(missing_ok=True)
    finally:
        if lock.is_locked:
            lock.release()


class NodeFolder(NodeSync):
    """One local node's `--ckpt-dir` folder and its share of `<ckpt uri>/ckpt-dir`."""

    def __init__(self, folder: Path, launch: LocalLaunch, node: int, bucket: Bucket, prefix: str):
        token = launch.token

        def writers() -> set[str]:
            return open_for_writing([p.pid for p in tagged_processes(token, node)])

        super().__init__(
            node_ckpt_dir(folder, node), node_dir(folder, node) / "ckpt-dir.upload",
            bucket, prefix, node, launch.num_nodes, writers,
        )  # fmt: skip
        self._saving = saving_path(folder, node)
        self._lost = node_dir(folder, node) / LOST_FILE
        self.lock = sync_lock(folder, node)

    def sync(self, *, final: bool = False, commit: bool = True) -> list[str]:
        if self._lost.exists():  # preempted: its disk is gone, nothing more reaches the bucket
            return []
        uploaded = super().sync(final=final, commit=commit)
        pending = self.pending()
        if pending:
            self._saving.write_text(json.dumps(pending))
        else:
            self._saving.unlink(missing_ok=True)
        return uploaded

    def drop(self) -> None:
        super().drop()
        if hasattr(self, "_saving"):
            self._saving.unlink(missing_ok=True)
            self._lost.unlink(missing_ok=True)


class CkptDirSync:
    """The `--ckpt-dir` folders of one local run, synced in a thread of the supervisor."""

    def __init__(self, folder: Path, launch: LocalLaunch, log: Callable[[str], None]):
        bucket, prefix = open_bucket(layout.ckpt_dir_uri(launch.ckpt_uri), retry_seconds=RETRY_S)
        self._bucket, self._prefix = bucket, prefix
        self.nodes = [
            NodeFolder(folder, launch, n, bucket, prefix) for n in range(launch.num_nodes)
        ]
        self._log = log
        self._disk = node_dir(folder, 0).parent  # every node's folder is on this disk
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: set[int] = set()
        self._failing: set[int] = set()

    def start_attempt(self) -> None:
        """Fresh folders from the bucket for every node, then sync them until `end_attempt`.
        `NoRoom` (nothing fetched) when the nodes' disk, one for all, cannot hold them all."""
        self.stop()
        verdicts = judge(self._bucket, self._prefix)
        for node in self.nodes:
            node.drop()
        first = folderrestore.first_choice(self._bucket, self._prefix, verdicts)
        self._disk.mkdir(parents=True, exist_ok=True)
        need = folderrestore.landed_bytes(first) * len(self.nodes)
        what = f"{folderrestore.describe(first)} on each of {len(self.nodes)} local node(s)"
        folderrestore.ensure_room(self._disk, need, what, "free space on this machine's disk")
        counts = [node.restore(verdicts) for node in self.nodes]
        line = restored_line(self.nodes[0], counts[0], aside=False)
        line = line.removeprefix("--ckpt-dir restored ")
        self._log(f"--ckpt-dir: every node starts with the bucket's {line}")
        aside = {name: why for node in self.nodes for name, why in node.aside.items()}
        for name, why in sorted(aside.items()):
            self._log(f"--ckpt-dir: {name} kept aside in the bucket, never restored: {why}")
        self._live = set(range(len(self.nodes)))
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="mncloud-ckpt-dir", daemon=True)
        self._thread.start()

    def resume_from(self) -> str | None:
        """The unit node 0 started this attempt with, to resume from (None: none)."""
        unit = self.nodes[0].resume_from
        return unit.name if unit is not None else None

    def node_env(self, n: int, env: dict[str, str]) -> None:
        """`$MNCLOUD_RESUME_FROM` in node `n`'s environment: the unit its framework resumes
        from, as a cloud node's run script exports it after its own restore."""
        unit = self.nodes[n].resume_from
        env.pop(constants.RESUME_FROM_ENV, None)
        if unit is not None:
            env[constants.RESUME_FROM_ENV] = str(self.nodes[n].path / unit.name)

    def newest_committed(self) -> str:
        """The unit the next attempt would resume from, as the bucket holds it now ("" if none
        or unreadable)."""
        with contextlib.suppress(Exception):
            verdicts = judge(self._bucket, self._prefix)
            chosen = folderrestore.first_choice(self._bucket, self._prefix, verdicts)
            unit = folderrestore.resume_unit(chosen)
            return unit.name if unit else ""
        return ""

    def replace_node(self, n: int) -> None:
        """Node recovery: node `n` comes back on a new VM, its folder afresh from the bucket."""
        self._guarded(n, self.nodes[n].restore)

    def end_attempt(self, exited: dict[int, int]) -> None:
        """Flush the nodes that ended on their own (`exited`: node -> exit code), committing
        their folders after a clean exit; drop the others' folders."""
        self.stop()
        for n, node in enumerate(self.nodes):
            if n in exited:
                clean = exited[n] in CLEAN_EXITS
                self._guarded(n, lambda node=node, clean=clean: node.close(commit=clean))
            else:
                node.drop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(SCAN_S):
            for n in sorted(self._live):
                self._guarded(n, self.nodes[n].sync)

    def _guarded(self, n: int, sync: Callable[[], object]) -> None:
        """Run one sync; a failing bucket is said once and retried at the next scan."""
        with self._lock, self.nodes[n].lock:
            try:
                sync()
            except Exception as err:  # a bucket outage must not stop supervision
                if n not in self._failing:
                    self._log(f"--ckpt-dir: node {n} cannot sync yet ({err}); retrying")
                self._failing.add(n)
            else:
                self._failing.discard(n)
