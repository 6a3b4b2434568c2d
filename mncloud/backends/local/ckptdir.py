"""`--ckpt-dir` on local nodes: a folder per node, kept in the bucket as MOUNT_CACHED keeps it.

On a cloud node `--ckpt-dir` links into the bucket, mounted by SkyPilot with MOUNT_CACHED
(rclone with a full cache on the VM's disk): a write lands on the disk, the file is uploaded
once it is closed (one PUT: the object is either the old one or the new one, never half),
SkyPilot waits for the uploads when the run script ends, and a preempted VM takes whatever was
not uploaded yet with it. A local node gets a plain folder (`MNCLOUD_CKPT_DIR`,
`nodes/node-N/ckpt-dir`) that the supervisor treats the same way:

    attempt starts  every node's folder is made afresh and filled from `<ckpt uri>/ckpt-dir`
                    (a new VM mounting the bucket sees what the bucket holds)
    every 0.25 s    a file that changed, has kept its size and mtime for one scan, and that no
                    process of its node holds open for writing is copied aside, checked
                    unchanged, and uploaded; a file gone from the folder is deleted
    node exits      (any exit code, e.g. 115 after a preemption notice) its folder is flushed,
                    as SkyPilot flushes the cache when the run script ends
    node killed     (chaos preempt, or torn down with the cluster) its folder is dropped unsynced

Example: rank 0 calls `torch.save(state, "/ckpt/snapshot.pt.tmp")` then `os.replace` onto
`snapshot.pt` at t=10.0; the scan at 10.25 sees snapshot.pt new, at 10.5 stable and closed,
uploads it by 10.6. Node 1 is preempted at 10.55: the relaunch reads the snapshot of t=10
only if its upload had finished, else the previous one, whole either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from mncloud import layout
from mncloud.backends.local.processes import tagged_processes
from mncloud.backends.local.state import LocalLaunch, node_ckpt_dir, node_dir
from mncloud.storage import Bucket, join_key, open_bucket

SCAN_S = 0.25
"""Seconds between two scans of the node folders."""
RETRY_S = 5.0
"""How long one bucket operation retries before the file waits for the next scan."""

Signature = tuple[int, int]
"""(size, mtime_ns) of a local file."""


def _signature(path: Path) -> Signature | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _files(root: Path) -> dict[str, Signature]:
    """Every regular file under `root` by its `/`-separated relative path."""
    found: dict[str, Signature] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            sig = _signature(path) if path.is_file() and not path.is_symlink() else None
            if sig is not None:
                found[path.relative_to(root).as_posix()] = sig
    return found


class NodeFolder:
    """One node's `--ckpt-dir` folder and its mirror under `<ckpt uri>/ckpt-dir`."""

    def __init__(self, folder: Path, launch: LocalLaunch, node: int, bucket: Bucket, prefix: str):
        self.path = node_ckpt_dir(folder, node)
        self._staging = node_dir(folder, node) / "ckpt-dir.upload"
        self._token, self._node = launch.token, node
        self._bucket, self._prefix = bucket, prefix
        self._synced: dict[str, Signature] = {}  # what the bucket holds of this folder
        self._seen: dict[str, Signature] = {}  # last signature of a changed file

    def _key(self, rel: str) -> str:
        return join_key(self._prefix, rel)

    def restore(self) -> int:
        """A fresh folder holding what the bucket holds (a new VM); return the file count."""
        self.drop()
        self.path.mkdir(parents=True, exist_ok=True)
        base = self._prefix.rstrip("/") + "/" if self._prefix else ""
        for obj in self._bucket.list(base):
            rel = obj.key[len(base) :]
            if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
                continue
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self._bucket.get_file(obj.key, target)
            sig = _signature(target)
            if sig is not None:
                self._synced[rel] = sig
        return len(self._synced)

    def drop(self) -> None:
        """Lose the folder and whatever it did not upload (a preempted VM's disk)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._staging.unlink(missing_ok=True)
        self._synced.clear()
        self._seen.clear()

    def _writers(self) -> set[str]:
        """Files under the folder that a process of this node holds open for writing."""
        held: set[str] = set()
        for proc in tagged_processes(self._token, self._node):
            with contextlib.suppress(psutil.Error):
                for opened in proc.open_files():
                    if getattr(opened, "mode", "r") != "r":
                        held.add(os.path.realpath(opened.path))
        return held

    def sync(self, *, final: bool = False) -> list[str]:
        """Upload closed, settled changes and delete removed files; return what was uploaded.

        `final`: the node's processes are gone; upload every change without waiting.
        """
        if not self.path.is_dir():
            return []
        current = _files(self.path)
        changed = [rel for rel, sig in current.items() if self._synced.get(rel) != sig]
        ready = [rel for rel in changed if final or self._seen.get(rel) == current[rel]]
        self._seen = {rel: current[rel] for rel in changed}
        writers = self._writers() if ready and not final else set()
        uploaded = []
        for rel in ready:
            if os.path.realpath(self.path / rel) not in writers and self._upload(rel):
                uploaded.append(rel)
        for rel in [r for r in self._synced if r not in current]:
            self._bucket.delete(self._key(rel))
            del self._synced[rel]
        return uploaded

    def _upload(self, rel: str) -> bool:
        """Copy the file aside, check it did not change meanwhile, upload the copy."""
        source = self.path / rel
        before = _signature(source)
        try:
            shutil.copyfile(source, self._staging)
        except OSError:
            return False  # removed or renamed meanwhile: the next scan sees it
        if before is None or _signature(source) != before:
            return False
        self._bucket.put_file(self._key(rel), self._staging)
        self._staging.unlink(missing_ok=True)
        self._synced[rel] = before
        self._seen.pop(rel, None)
        return True


class CkptDirSync:
    """The `--ckpt-dir` folders of one local run, synced in a thread of the supervisor."""

    def __init__(self, folder: Path, launch: LocalLaunch, log: Callable[[str], None]):
        bucket, prefix = open_bucket(layout.ckpt_dir_uri(launch.ckpt_uri), retry_seconds=RETRY_S)
        self.nodes = [
            NodeFolder(folder, launch, n, bucket, prefix) for n in range(launch.num_nodes)
        ]
        self._log = log
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: set[int] = set()
        self._failing: set[int] = set()

    def start_attempt(self) -> None:
        """Fresh folders from the bucket for every node, then sync them until `end_attempt`."""
        self.stop()
        counts = [node.restore() for node in self.nodes]
        self._log(f"--ckpt-dir: every node starts with the bucket's {counts[0]} file(s)")
        self._live = set(range(len(self.nodes)))
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="mncloud-ckpt-dir", daemon=True)
        self._thread.start()

    def end_attempt(self, exited: set[int]) -> None:
        """Flush the nodes that ended on their own (`exited`); drop the others' folders."""
        self.stop()
        for n, node in enumerate(self.nodes):
            if n in exited:
                self._guarded(n, lambda node=node: node.sync(final=True))
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
        with self._lock:
            try:
                sync()
            except Exception as err:  # a bucket outage must not stop supervision
                if n not in self._failing:
                    self._log(f"--ckpt-dir: node {n} cannot sync yet ({err}); retrying")
                self._failing.add(n)
            else:
                self._failing.discard(n)
