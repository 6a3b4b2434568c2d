"""One node's `--ckpt-dir` folder kept in `<ckpt uri>/ckpt-dir`, folders committed whole.

Used by the local supervisor (`backends/local/ckptdir.py`, one per simulated node) and, on a
cloud VM, as a process of its own started by the run script beside the launcher:

    python -m mncloud.storage.foldersync run --dir /ckpt --uri s3://b/exp/run/ckpt-dir
        --node 1 --nodes 2 --watch $$ --rc-file F --ready R &

It first restores (`restore` alone does only that), writes R with the name of the unit the
framework resumes from (`folderrestore.resume_unit`; empty: none; the run script exports its
path as `$MNCLOUD_RESUME_FROM` and starts the launcher then), and syncs until SIGTERM. Restoring
fills an empty folder with what the framework resumes from (`folderrestore.py`): of the
committed units (`folders.judge`) the newest `checkpoint-N/` or `step-N/` (and the Trainer's
best), every other unit as it is, each file's size and xxh3_128 checked against its markers (a
top-level file's: its record), many ranges at once; a unit that fails is left out, reported
(`refused.json` beside its markers, shown by `ckpt ls`) and never deleted, and the next older
one is restored instead (for Lightning's `last.ckpt`, a copy of the newest `epoch=…-step=….ckpt`
stands in, never uploaded until the script writes `last.ckpt` itself). Too little disk for it:
one line, exit 2, nothing fetched (the run script's node then refuses: `REFUSED_MARKER_ENV`).
`run` scans every 0.25 s: a file changed since the last upload, still for one scan and open for
writing by no process under `--watch`, is uploaded (a logger's file also unsettled, every
`LOG_SNAPSHOT_S`; a folder's file on S3 straight from the disk, hashed as it is read and counted
only if it did not change meanwhile; any other copied aside first, a top-level file then
recorded by this node's marker); a folder whose files are all uploaded is committed by this
node's marker (`folders.write_marker`; a logger's folder only at the end, by a node that
uploaded some of it), deleted first whenever one of its files changes or goes. A folder the
framework deletes (its rotation) is deleted from the bucket, and with it the older ones of its
family that the restore left there: the framework would have deleted them first. Nothing else
absent from the node is ever deleted. SIGTERM ends it: everything is uploaded, and marked if the
run script's exit code (read from `--rc-file`) says the node ended cleanly (0, or the preemption
notice's 115): a node that crashed mid-save leaves its last folder uncommitted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from mncloud.constants import PREEMPTED_EXIT_CODE, REFUSED_MARKER_ENV
from mncloud.errors import MncloudError, StorageError
from mncloud.storage import folderrestore, folders, transfer
from mncloud.storage.buckets import Bucket, delete_prefix
from mncloud.storage.factory import open_bucket
from mncloud.storage.frameworkdirs import rotated
from mncloud.storage.s3 import S3Bucket
from mncloud.storage.url import join_key

SCAN_S = 0.25
"""Seconds between two scans of a node's folder."""
LOG_SNAPSHOT_S = 5.0
"""A logger's file that keeps changing (TensorBoard's event file, held open for writing and
appended at every step: never settled) is uploaded as it is, a copy, at most this often and
before any checkpoint's file (a resume finds the steps before it); it would otherwise reach
the bucket only at the end, and a preemption would lose every step."""
CLEAN_EXITS = (0, PREEMPTED_EXIT_CODE)
"""Exit codes after which a node's pending folders are committed at its final flush."""

STAMP = ".mncloud-node"
"""In a node's folder: mncloud restored it (so a later restore may empty it)."""

Signature = tuple[int, int]
"""(size, mtime_ns) of a local file."""


@dataclass(frozen=True)
class Synced:
    """A file as the bucket holds it: its local signature then, its size and hash."""

    sig: Signature
    size: int
    digest: str


def _signature(path: Path) -> Signature | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _fd_signature(fd: int) -> Signature:
    st = os.fstat(fd)
    return (st.st_size, st.st_mtime_ns)


def local_files(root: Path) -> dict[str, Signature]:
    """Every regular file under `root` outside temporary top-level names, by relative path."""
    found: dict[str, Signature] = {}
    for dirpath, dirs, names in os.walk(root):
        if Path(dirpath) == root:
            dirs[:] = [d for d in dirs if not folders.is_temporary(d)]
            names = [n for n in names if not folders.is_temporary(n)]
        for name in names:
            path = Path(dirpath) / name
            sig = _signature(path) if path.is_file() and not path.is_symlink() else None
            if sig is not None:
                found[path.relative_to(root).as_posix()] = sig
    return found


def open_for_writing(pids: list[int]) -> set[str]:
    """Real paths that these processes, or any process under them, hold open for writing."""
    held: set[str] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    for opened in proc.open_files():
                        if getattr(opened, "mode", "r") != "r":
                            held.add(os.path.realpath(opened.path))
    return held


class NodeSync:
    """One node's folder and its share of the bucket's `--ckpt-dir`."""

    def __init__(
        self,
        path: Path,
        staging: Path,
        bucket: Bucket,
        prefix: str,
        node: int,
        nodes: int,
        writers: Callable[[], set[str]],
    ):
        self.path, self._staging = path, staging
        self._bucket, self._prefix = bucket, prefix
        self.node, self.nodes = node, nodes
        self._writers = writers
        self._synced: dict[str, Synced] = {}
        self._seen: dict[str, Signature] = {}
        self._marked: set[str] = set()  # units whose marker from this node is current
        self._wrote: set[str] = set()  # units this node uploaded a file of, this attempt
        self._stand_ins: dict[str, Signature] = {}  # copies restore put there, as it did
        self._snapshots: dict[str, float] = {}  # a logger's file -> when last sent unsettled
        self.aside: dict[str, str] = {}  # units (a logger's files) restore left out -> why
        self.left: dict[str, str] = {}  # older folders left in the bucket -> the one restored
        self.resume_from: folders.Verdict | None = None  # what the framework resumes from
        self.stand_ins: dict[str, str] = {}  # a refused `last.ckpt` -> the file copied there

    def _key(self, rel: str) -> str:
        return join_key(self._prefix, rel)

    # ------------------------------------------------------------------ restore

    def restore(self, verdicts: list[folders.Verdict] | None = None) -> tuple[int, int]:
        """A fresh folder holding what the framework resumes from (`folderrestore`); return
        the (folders, files) placed. `NoRoom` before a byte is fetched if it cannot fit."""
        self.drop()
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / STAMP).touch()
        verdicts = folders.judge(self._bucket, self._prefix) if verdicts is None else verdicts
        done = folderrestore.restore_units(
            self._bucket, self._prefix, self.path, verdicts, self.node
        )
        for rel, (size, digest) in done.files.items():
            sig = _signature(self.path / rel)
            assert sig is not None
            self._synced[rel] = Synced(sig, size, digest)
        refused = [n for n in done.aside if n in {v.name for v in verdicts if not v.folder}]
        for name in [v.name for v in done.units] + refused:  # a marker goes before a change
            if self._bucket.exists(folders.marker_key(self._prefix, name, self.node)):
                self._marked.add(name)
        for name in done.stand_ins:  # not the bucket's: never uploaded until the script writes it
            self._stand_ins[name] = _signature(self.path / name) or (0, 0)
        self.aside, self.left, self.stand_ins = done.aside, done.left, done.stand_ins
        self.resume_from = folderrestore.resume_unit(done.units)
        return done.counts()

    def check_own(self) -> None:
        """Refuse a folder that holds files mncloud did not put there (a restore empties it)."""
        if self.path.is_dir() and any(self.path.iterdir()) and not (self.path / STAMP).exists():
            raise StorageError(
                f"{self.path} holds files mncloud did not put there; give --ckpt-dir an empty "
                "or new folder"
            )

    def drop(self) -> None:
        """Lose the folder and whatever it did not upload (a preempted VM's disk)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._staging.unlink(missing_ok=True)
        self._synced.clear()
        self._seen.clear()
        self._marked.clear()
        self._wrote.clear()
        self._stand_ins.clear()
        self.aside = {}
        self.left = {}
        self.resume_from = None
        self.stand_ins = {}

    # ------------------------------------------------------------------ sync

    def sync(self, *, final: bool = False, commit: bool = True) -> list[str]:
        """Upload settled changes, delete removed files, commit whole folders; return the
        uploaded paths. `final`: the node's processes are gone (upload without waiting);
        `commit`: write markers (False after a crash: pending folders stay uncommitted)."""
        if not self.path.is_dir():
            return []
        current = self._current()
        changed = [rel for rel, sig in current.items() if self._sig(rel) != sig]
        removed = [rel for rel in self._synced if rel not in current]
        for unit in {folders.unit_of(r)[0] for r in changed + removed} & self._marked:
            self._bucket.delete(folders.marker_key(self._prefix, unit, self.node))
            self._marked.discard(unit)
        for unit in {folders.unit_of(r)[0] for r in changed} & self.left.keys():
            self._bucket.delete(folders.marker_key(self._prefix, unit, self.node))
            del self.left[unit]  # written anew here (its old marker from this node gone first)
        settled = [rel for rel in changed if final or self._seen.get(rel) == current[rel]]
        writers = self._writers() if settled and not final else set()
        free = [r for r in settled if os.path.realpath(self.path / r) not in writers]
        saving = any(not _is_log(rel) for rel in free)  # a checkpoint's files going up
        growing = {r for r in changed if _is_log(r) and (saving or self._due(r))} - {*free}
        self._seen = {rel: current[rel] for rel in changed}
        uploaded = [  # a logger's files first: a resume from the checkpoint finds its steps
            rel for rel in sorted({*free, *growing}, key=lambda rel: not _is_log(rel))
            if self._upload(rel, snapshot=rel in growing)
        ]  # fmt: skip
        for rel in removed:
            self._bucket.delete(self._key(rel))
            del self._synced[rel]
            if not folders.unit_of(rel)[1]:  # a file's records go with it
                delete_prefix(self._bucket, join_key(self._prefix, folders.COMMITS, rel))
        self._follow_rotation({u for u, folder in map(folders.unit_of, removed) if folder})
        if commit:
            self._commit(current, final=final)
        return uploaded

    def _current(self) -> dict[str, Signature]:
        """The node's files, less the stand-ins the restore copied there and nobody changed
        since (a stand-in the script writes is its own file from then on)."""
        current = local_files(self.path)
        for rel, sig in list(self._stand_ins.items()):
            if current.get(rel) == sig:
                del current[rel]
            else:
                del self._stand_ins[rel]
        return current

    def _follow_rotation(self, removed: set[str]) -> None:
        """The framework deleted these folders: those of their family it never saw here, older
        (left in the bucket by the restore), would have gone first; delete them now (markers
        first). A folder that is merely absent here is never deleted for that alone."""
        for unit in removed:
            passed = rotated(unit)
            if passed is None or (self.path / unit).exists():
                continue
            for name in sorted(self.left):
                older = rotated(name)
                if older is not None and older.family == passed.family and older.step < passed.step:
                    delete_prefix(self._bucket, join_key(self._prefix, folders.COMMITS, name))
                    delete_prefix(self._bucket, join_key(self._prefix, name))
                    del self.left[name]

    def _due(self, rel: str) -> bool:
        """Whether a logger's file was not sent unsettled for `LOG_SNAPSHOT_S`."""
        last = self._snapshots.get(rel)
        return last is None or time.monotonic() - last >= LOG_SNAPSHOT_S

    def _sig(self, rel: str) -> Signature | None:
        entry = self._synced.get(rel)
        return entry.sig if entry else None

    def _commit(self, current: dict[str, Signature], *, final: bool = False) -> None:
        """Mark every folder all of whose files are uploaded as they are now; a logger's
        folder only at the end (`final`), and only where this node uploaded some of it."""
        units: dict[str, list[str]] = {}
        for rel in current:
            unit, folder = folders.unit_of(rel)
            if folder:
                units.setdefault(unit, []).append(rel)
        for unit, rels in units.items():
            if unit in self._marked or any(self._sig(r) != current[r] for r in rels):
                continue
            if folders.is_log(unit):
                if not final or unit not in self._wrote:
                    continue
            elif not folders.hinted(self.path, unit, max(current[r][1] for r in rels)):
                continue
            share = {
                r.partition("/")[2]: (self._synced[r].size, self._synced[r].digest) for r in rels
            }
            self._bucket.delete(folders.refused_key(self._prefix, unit))
            folders.write_marker(self._bucket, self._prefix, unit, self.node, self.nodes, share)
            self._marked.add(unit)

    def pending(self) -> list[str]:
        """Units this node is writing or has not put in the bucket as they are now (chaos's
        `--during-save`): folders (named with a trailing `/`) under a temporary name or not
        committed by this node, and top-level files under a temporary name or not uploaded."""
        if not self.path.is_dir():
            return []
        found = []
        for entry in os.scandir(self.path):
            name, temporary = entry.name, folders.is_temporary(entry.name)
            if name.startswith(".mncloud"):
                continue
            if entry.is_dir(follow_symlinks=False):
                new = temporary or (name not in self._marked and not folders.is_log(name))
                found += [name + "/"] if new else []
            elif entry.is_file(follow_symlinks=False):
                sig = _signature(Path(entry.path))
                new = temporary or (self._sig(name) != sig and self._stand_ins.get(name) != sig)
                found += [name] if new else []
        return sorted(found)

    def _upload(self, rel: str, *, snapshot: bool = False) -> bool:
        """Upload one file as it is now; False if it changed meanwhile (the next scan tries
        again). A folder's file on S3 goes straight from the disk, hashed as it is read (its
        marker covers it); any other is copied aside first and the copy uploaded: a one-file
        unit has no marker to say it is whole. `snapshot`: a logger's file still growing, its
        copy sent whatever it grew meanwhile (an appended log's prefix is a log; the next scan
        sees the change and the end of the attempt sends it whole)."""
        if snapshot:
            self._snapshots[rel] = time.monotonic()
        elif folders.unit_of(rel)[1] and transfer.streams(self._bucket):
            return self._stream(rel, self._bucket)
        source = self.path / rel
        before = _signature(source)
        try:
            self._staging.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, self._staging)
        except OSError:
            return False  # removed or renamed meanwhile: the next scan sees it
        if before is None or (not snapshot and _signature(source) != before):
            return False
        digest, size = folders.hash_file(self._staging), self._staging.stat().st_size
        self._bucket.put_file(self._key(rel), self._staging)
        self._staging.unlink(missing_ok=True)
        self._uploaded(rel, before, digest, size)
        if not folders.unit_of(rel)[1]:  # a one-file unit: its record, which a restore checks
            self._bucket.delete(folders.refused_key(self._prefix, rel))
            share = {folders.FILE_ENTRY: (before[0], digest)}
            folders.write_marker(self._bucket, self._prefix, rel, self.node, self.nodes, share)
            self._marked.add(rel)
        return True

    def _stream(self, rel: str, bucket: S3Bucket) -> bool:
        try:
            fd = os.open(self.path / rel, os.O_RDONLY)
        except OSError:
            return False
        try:
            before = _fd_signature(fd)
            if before != _signature(self.path / rel):
                return False  # replaced between the look and the open
            digest = transfer.put_stream(bucket, self._key(rel), fd, before[0])
            if _fd_signature(fd) != before:
                return False  # written in place while it was read: not marked, sent again
        except transfer.Changed:
            return False
        finally:
            os.close(fd)
        self._uploaded(rel, before, digest)
        return True

    def _uploaded(self, rel: str, sig: Signature, digest: str, size: int | None = None) -> None:
        self._synced[rel] = Synced(sig, sig[0] if size is None else size, digest)
        self._seen.pop(rel, None)
        self._wrote.add(folders.unit_of(rel)[0])

    def close(self, *, commit: bool) -> None:
        """The node ended on its own: upload everything; with `commit`, mark what is whole and
        give an empty marker to each folder the other nodes marked and this node never held."""
        self.sync(final=True, commit=commit)
        if not commit:
            return
        for v in folders.judge(self._bucket, self._prefix):
            held = (self.path / v.name).exists()
            if v.folder and not v.committed and v.name not in self.aside and not held:
                key = folders.marker_key(self._prefix, v.name, self.node)
                if v.reason.startswith("no marker from") and not self._bucket.exists(key):
                    folders.write_marker(
                        self._bucket, self._prefix, v.name, self.node, self.nodes, {}
                    )


# ---------------------------------------------------------------------- the VM's process


def _is_log(rel: str) -> bool:
    return folders.is_log(folders.unit_of(rel)[0])


def _node_sync(args: argparse.Namespace) -> NodeSync:
    bucket, prefix = open_bucket(args.uri)
    path = Path(args.dir)
    staging = Path(os.environ.get("TMPDIR", "/tmp")) / f"mncloud-ckpt-upload-{args.node}"
    watch = [int(p) for p in args.watch]
    return NodeSync(
        path, staging, bucket, prefix, args.node, args.nodes, lambda: open_for_writing(watch)
    )


def restored_line(node: NodeSync, placed: tuple[int, int], *, aside: bool = True) -> str:
    """What a restore placed, what it left in the bucket and what it kept aside, one line."""
    left: dict[str, list[str]] = {}
    for name, newer in node.left.items():
        left.setdefault(newer, []).append(name)
    said = "".join(
        f"; left in the bucket, not restored: {', '.join(sorted(names, key=_step))} (older "
        f"than {newer}, which the framework resumes from)"
        for newer, names in sorted(left.items())
    )
    kept = "".join(f"; kept aside: {n} ({why})" for n, why in sorted(node.aside.items()))
    stood = "".join(f"; {stand_in_said(n, source)}" for n, source in sorted(node.stand_ins.items()))
    return (
        f"--ckpt-dir restored {placed[0]} folder(s), {placed[1]} file(s){said}"
        + (kept if aside else "")
        + stood
    )


def stand_in_said(name: str, source: str) -> str:
    """What a stand-in for a refused Lightning `last.ckpt` is, in a few words."""
    return (
        f'{name} is a copy of {source}, the newest checkpoint restored: ckpt_path="last" '
        f"resumes from it (the bucket's {name} was refused)"
    )


def _step(name: str) -> int:
    found = rotated(name)
    return found.step if found else 0


def _say_restored(node: NodeSync, placed: tuple[int, int]) -> None:
    print(f"mncloud: {restored_line(node, placed)}", file=sys.stderr, flush=True)


def _run(node: NodeSync, rc_file: str | None, ready: str | None) -> None:
    """Restore, say so in `ready`, sync until SIGTERM, then close."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _say_restored(node, node.restore())
    if ready:  # the run script's $MNCLOUD_RESUME_FROM, whole once the file exists
        said = Path(f"{ready}.part")
        said.write_text(node.resume_from.name if node.resume_from else "")
        said.replace(ready)
    failing = False
    while not stop.wait(SCAN_S):
        try:
            node.sync()
        except MncloudError as err:  # a bucket outage: said once, retried at the next scan
            if not failing:
                print(f"mncloud: --ckpt-dir cannot sync yet ({err}); retrying", file=sys.stderr)
            failing = True
        else:
            failing = False
    rc = Path(rc_file).read_text().strip() if rc_file and Path(rc_file).exists() else ""
    node.close(commit=rc.lstrip("-").isdigit() and int(rc) in CLEAN_EXITS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mncloud.storage.foldersync")
    parser.add_argument("action", choices=["restore", "run"])
    parser.add_argument("--dir", required=True, help="the node's --ckpt-dir folder")
    parser.add_argument("--uri", required=True, help="<ckpt uri>/ckpt-dir")
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--watch", action="append", default=[], help="pid whose tree writes")
    parser.add_argument("--rc-file", help="where the run script leaves the launcher's exit code")
    parser.add_argument(
        "--ready", help="written once the folder is restored (run): the unit to resume from"
    )
    args = parser.parse_args(argv)
    try:
        node = _node_sync(args)
        node.check_own()
        if args.action == "restore":
            _say_restored(node, node.restore())
        else:
            _run(node, args.rc_file, args.ready)
    except folderrestore.NoRoom as err:  # the same disk next time: the node refuses
        print(f"mncloud: {err}", file=sys.stderr)
        marker = os.environ.get(REFUSED_MARKER_ENV)
        if marker:
            with contextlib.suppress(OSError):
                Path(marker).write_text(f"{err}\n", encoding="utf-8")
        return 2
    except MncloudError as err:
        print(f"mncloud: --ckpt-dir: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
