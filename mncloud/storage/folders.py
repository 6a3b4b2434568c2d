"""Checkpoint folders committed as a whole in `<ckpt uri>/ckpt-dir` (`--ckpt-dir`).

A framework writes a checkpoint *folder* file by file (the Trainer's `checkpoint-N/`,
torchtitan's DCP `step-N/`, a sharded Lightning `*.ckpt/`); each node's sync (`foldersync.py`)
uploads its own files of it. Here: what makes such a folder count, how it is read back whole,
and the small API the training side uses.

**Units.** Every top-level folder of `--ckpt-dir` is one unit, whatever its name; a top-level
plain file is a one-file unit, committed by its one upload (write it elsewhere and `os.replace`
it into place, as today), which its node records after it (a marker whose one entry, `""`,
gives its size and xxh3_128): a restore checks the file against that record. Temporary names
are never synced: top-level `tmp-*` (the Trainer's `tmp-checkpoint-*`, renamed when the save
ends), `*.tmp`, `*.partial` and `.mncloud*`.

**Logs.** A top-level folder named in `LOG_FOLDERS` (`lightning_logs/`, `runs/`, `wandb/`, …)
holds a logger's files, not a checkpoint: it is never incomplete nor torn. Its files go up as
they settle, like plain files; each node that uploaded some of them marks its share when its
attempt ends cleanly; a restore brings every file of it, each checked against the markers
that name it (one that fails is left in the bucket and named, the others restored).

**Commit.** A node's share of a folder is committed by a marker, written after its files:
`<ckpt-dir>/.mncloud-commits/<folder>/node-<N>.json` naming every file the node holds there with
its size and xxh3_128. A folder is *committed* when every node of the attempt that wrote the
newest marker (its `nodes`) has its marker there and every file a marker names is in the bucket
at its size (a file two nodes wrote must match one of their markers). Per-node markers, not one
union marker: no node has to wait for the others or read their disks. Before a node changes or
deletes a file of a folder it marked, it deletes its marker first, so the folder stops counting.
A node that holds nothing of a folder the others marked writes an empty marker when it exits on
its own; until then (or if it is lost) that folder is not committed: a folder every node writes
(Trainer checkpoints with `rng_state_<rank>.pth`, DCP shards) commits while training runs, a
folder only node 0 writes commits at the end (write such saves as one file instead).

Timeline, 2 nodes, `save_steps=200`:

    t=10.0  both nodes' Trainers rename tmp-checkpoint-400 onto checkpoint-400/
    t=10.5  node 0's files kept still one scan: uploaded, then node-0.json (6 files)
    t=10.6  node 1's rng_state_1.pth uploaded, then node-1.json: checkpoint-400 is committed
    t=20.1  node 1 is preempted while its checkpoint-600 uploads: node-1.json of it never comes
    t=25    the next attempt restores checkpoint-400 (every file of both markers, each one's
            size and hash checked) to both nodes; checkpoint-600 stays in the bucket, listed by
            `mncloud ckpt ls` as "incomplete: no marker from node 1 (of 2)", and is never shown
            to the script, which resumes from 400 and later writes 600 afresh (re-committed).

A committed folder whose file fails its hash at restore is refused (`Verdict.reason` names the
file and the folder) and left out, so the framework resumes from the next older one; a
top-level file that fails its record is refused the same way (`refused.json` beside its
record), until a newer upload records it afresh.

**API for the training side** (torch-free; `MNCLOUD_CKPT_DIR` is the node's folder):
- `announce()`: from then on this node's folders commit only when `saved()` says so (call it
  once per node before the first save, e.g. a callback's `on_train_begin`).
- `saved(folder)`: this node's ranks have written every file of `folder` (call it once per node,
  after the node's ranks are done: e.g. local rank 0 after a barrier, in `on_save`).
  Without `announce()`, a folder is marked once every file of it kept still one scan (0.25 s)
  and none is open for writing: enough for a folder renamed into place, as the Trainer does.
- `survey(ckpt_uri)` -> every unit's `Verdict` (committed or why not); `inventory(ckpt_uri)`
  adds the files, from the same one listing; `newest_committed(units)`: the committed unit
  with the highest step in its name (`storage.frameworkdirs`), which the run's summary,
  `status` and `ckpt ls` name.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from mncloud import layout
from mncloud.constants import CKPT_DIR_ENV
from mncloud.errors import StorageError
from mncloud.storage.buckets import Bucket, ObjectInfo
from mncloud.storage.factory import open_bucket
from mncloud.storage.frameworkdirs import Newest, newest
from mncloud.storage.url import join_key

COMMITS = ".mncloud-commits"
"""The bucket folder, beside the units, that holds the markers."""
HINTS = ".mncloud-saved"
"""A node's local folder of `saved()` hints (never synced)."""
ANNOUNCED = ".announced"
_TEMPORARY = re.compile(r"^(tmp-.*|.*\.tmp|.*\.partial|\.mncloud.*)$")
_MARKER = re.compile(r"^node-(\d+)\.json$")
REFUSED = "refused.json"
"""Beside a unit's markers: a restore refused it (its reason); cleared by a new marker."""
FILE_ENTRY = ""
"""A one-file unit's marker names its one file by this path (the unit itself)."""
LOG_FOLDERS = (
    "lightning_logs", "runs", "wandb", "mlruns", "tensorboard", "tb_logs", "logs",
)  # fmt: skip
"""Top-level folders loggers write (Lightning's `default_root_dir/lightning_logs`, the
Trainer's and TensorBoard's `runs`, Weights & Biases, MLflow): kept file by file (see Logs)."""


def is_log(top: str) -> bool:
    """Is this top-level folder name a logger's (`LOG_FOLDERS`), not a checkpoint?"""
    return top in LOG_FOLDERS


def is_temporary(top: str) -> bool:
    """Is this top-level name one that is never synced (a save still in progress)?"""
    return bool(_TEMPORARY.match(top))


def unit_of(rel: str) -> tuple[str, bool]:
    """The unit a `/`-separated relative path belongs to, and whether it is a folder."""
    top, sep, _rest = rel.partition("/")
    return top, bool(sep)


def hash_file(path: str | os.PathLike[str]) -> str:
    """The file's xxh3_128, hex."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(4 * 1024 * 1024):
            h.update(block)
    return str(h.hexdigest())


def marker_key(prefix: str, unit: str, node: int) -> str:
    return join_key(prefix, COMMITS, unit, f"node-{node}.json")


def refused_key(prefix: str, unit: str) -> str:
    return join_key(prefix, COMMITS, unit, REFUSED)


def write_marker(
    bucket: Bucket, prefix: str, unit: str, node: int, nodes: int, files: dict[str, tuple[int, str]]
) -> None:
    """Commit node `node`'s share of `unit`: `files` maps a path inside it to (size, hash)."""
    body = {
        "unit": unit, "node": node, "nodes": nodes, "t": time.time(),
        "files": {rel: {"size": s, "xxh3_128": h} for rel, (s, h) in sorted(files.items())},
    }  # fmt: skip
    bucket.put_bytes(marker_key(prefix, unit, node), json.dumps(body, indent=1).encode())


@dataclass
class Verdict:
    """One unit of the bucket's `--ckpt-dir` folder, as a restore would judge it."""

    name: str
    folder: bool
    committed: bool
    reason: str = ""
    """Why it is not committed (empty when it is)."""
    files: dict[str, tuple[int, set[str]]] = field(default_factory=dict)
    """Path inside the unit (`""` for a one-file unit) -> (size, the hashes its markers give
    it; none: nothing recorded it, only its size is checked)."""
    size: int = 0
    mtime: float = 0.0
    log: bool = False
    """A logger's folder (`LOG_FOLDERS`): always restored, file by file."""


def _markers(bucket: Bucket, prefix: str, objs: list[ObjectInfo]) -> dict[str, dict[int, dict]]:
    base = join_key(prefix, COMMITS) + "/"
    found: dict[str, dict[int, dict]] = {}
    for obj in objs:
        unit, _, name = obj.key[len(base) :].partition("/")
        match = _MARKER.match(name)
        if match or name == REFUSED:
            try:
                body = json.loads(bucket.get_bytes(obj.key))
            except (StorageError, ValueError):
                continue  # deleted meanwhile, or unreadable: as if absent
            found.setdefault(unit, {})[int(match[1]) if match else -1] = body
    return found


def judge(bucket: Bucket, prefix: str, objs: list[ObjectInfo] | None = None) -> list[Verdict]:
    """Every unit under `prefix` (the bucket side of `--ckpt-dir`), committed or why not;
    `objs`: the listing of `prefix/`, when the caller made it already.

    Sizes only: a content hash is checked where the files are read (`foldersync.restore`)."""
    base = f"{prefix}/" if prefix else ""
    objs = bucket.list(base) if objs is None else objs
    commits = [o for o in objs if o.key[len(base) :].startswith(COMMITS + "/")]
    held: dict[str, ObjectInfo] = {
        o.key[len(base) :]: o for o in objs if not o.key[len(base) :].startswith(COMMITS + "/")
    }
    markers = _markers(bucket, prefix, commits)
    units: dict[str, Verdict] = {}
    for rel, obj in held.items():
        name, folder = unit_of(rel)
        v = units.setdefault(name, Verdict(name, folder, committed=not folder))
        v.size += obj.size
        v.mtime = max(v.mtime, obj.mtime)
        if not folder:
            v.files[FILE_ENTRY] = (obj.size, set())
    for name, marks in markers.items():
        if name not in units and not all(_is_file_record(m) for m in marks.values()):
            units[name] = Verdict(name, True, committed=False)  # else: a file deleted since
    for v in units.values():
        if not v.folder:
            _judge_file(v, markers.get(v.name, {}))
        elif is_log(v.name):
            _judge_logs(v, markers.get(v.name, {}), held)
        else:
            _judge_folder(v, markers.get(v.name, {}), held)
    return sorted(units.values(), key=lambda v: v.name)


def _is_file_record(mark: dict) -> bool:
    """A one-file unit's record (or a refusal, which names no files)."""
    files = mark.get("files")
    return files is None or FILE_ENTRY in files


def _refused(marks: dict[int, dict], since: float = 0.0) -> str | None:
    """The reason of a refusal newer than every marker (and than `since`), else None."""
    refused = marks.pop(-1, None)
    if refused is None:
        return None
    t = refused.get("t", 0)
    if any(m.get("t", 0) > t for m in marks.values()) or (not marks and since > t):
        return None
    return str(refused.get("reason", "refused"))


def _judge_file(v: Verdict, marks: dict[int, dict]) -> None:
    """A one-file unit: as its records say (size and hashes); without one (uploaded before
    mncloud recorded files, or its record not yet written), by its size alone."""
    why = _refused(marks, since=v.mtime)
    if why is not None:
        v.committed, v.reason = False, why
        return
    records = [m["files"][FILE_ENTRY] for m in marks.values() if _is_file_record(m)]
    if not records:
        return
    size = v.files[FILE_ENTRY][0]
    hashes = {str(r["xxh3_128"]) for r in records if int(r["size"]) == size}
    if not hashes:
        said = " or ".join(sorted({f"{int(r['size'])} B" for r in records}))
        v.committed, v.reason = False, f"{v.name} is {size} B, its record says {said}"
        return
    v.files[FILE_ENTRY] = (size, hashes)


def _judge_logs(v: Verdict, marks: dict[int, dict], held: dict[str, ObjectInfo]) -> None:
    """A logger's folder: every file it holds, with the hashes any node's marker gives it."""
    marks.pop(-1, None)
    v.committed, v.log = True, True
    base = f"{v.name}/"
    for key, obj in held.items():
        if key.startswith(base):
            rel = key[len(base) :]
            hashes = {
                str(m["files"][rel]["xxh3_128"])
                for m in marks.values()
                if rel in m.get("files", {})
            }
            v.files[rel] = (obj.size, hashes)


def _judge_folder(v: Verdict, marks: dict[int, dict], held: dict[str, ObjectInfo]) -> None:
    why = _refused(marks)
    if why is not None:
        v.reason = why
        return
    if not marks:
        v.reason = "no commit marker (being written, or a node was lost while it wrote it)"
        return
    nodes = int(max(marks.values(), key=lambda m: m.get("t", 0)).get("nodes", 1))
    missing = [n for n in range(nodes) if n not in marks]
    if missing:
        v.reason = f"no marker from node {', '.join(map(str, missing))} (of {nodes})"
        return
    for n in range(nodes):
        for rel, entry in marks[n].get("files", {}).items():
            size, hashes = v.files.setdefault(rel, (int(entry["size"]), set()))
            hashes.add(str(entry["xxh3_128"]))
    for rel, (size, _) in sorted(v.files.items()):
        obj = held.get(f"{v.name}/{rel}")
        if obj is None:
            v.reason = f"{rel} missing"
            return
        if obj.size != size and not _any_size(v, rel, obj.size, marks):
            v.reason = f"{rel} is {obj.size} B, its marker says {size} B"
            return
    v.committed = True


def _any_size(v: Verdict, rel: str, size: int, marks: dict[int, dict]) -> bool:
    """Does some marker give `rel` this size (two nodes wrote it)? Keep that size."""
    for m in marks.values():
        entry = m.get("files", {}).get(rel)
        if entry and int(entry["size"]) == size:
            v.files[rel] = (size, v.files[rel][1])
            return True
    return False


def survey(ckpt_uri: str, retry_seconds: float = 5.0) -> list[Verdict]:
    """A run's `--ckpt-dir` units in its bucket (`ckpt_uri` is the run's checkpoint URL)."""
    return inventory(ckpt_uri, retry_seconds).units


@dataclass
class Inventory:
    """A run's `--ckpt-dir` folder in its bucket, from one listing: what `status` shows."""

    units: list[Verdict]
    files: list[ObjectInfo]
    """Every object but mncloud's markers, its key relative to the folder."""

    @property
    def newest(self) -> Newest | None:
        """The newest committed unit by the step in its name (`newest_committed`)."""
        return newest_committed(self.units)


def inventory(ckpt_uri: str, retry_seconds: float = 5.0) -> Inventory:
    """The units and files of a run's `--ckpt-dir` folder, the bucket listed once."""
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(ckpt_uri), retry_seconds=retry_seconds)
    base = f"{prefix}/" if prefix else ""
    objs = bucket.list(base)
    files = [
        ObjectInfo(key=o.key[len(base) :], size=o.size, mtime=o.mtime)
        for o in objs
        if not o.key[len(base) :].startswith(f"{COMMITS}/")
    ]
    return Inventory(judge(bucket, prefix, objs), files)


def newest_committed(units: list[Verdict]) -> Newest | None:
    """The committed unit with the highest step in its name (`frameworkdirs.newest`): what
    the run's summary, `status` and `ckpt ls` name as its newest checkpoint."""
    return newest(v.name for v in units if v.committed and not v.log)


# --------------------------------------------------------------------- the training side


def _hints(ckpt_dir: str | os.PathLike[str] | None) -> Path:
    root = ckpt_dir or os.environ.get(CKPT_DIR_ENV)
    if not root:
        raise StorageError(f"no --ckpt-dir folder: {CKPT_DIR_ENV} is not set")
    return Path(root) / HINTS


def announce(ckpt_dir: str | os.PathLike[str] | None = None) -> None:
    """This node's folders commit only once `saved()` names them (see the module docstring)."""
    hints = _hints(ckpt_dir)
    hints.mkdir(parents=True, exist_ok=True)
    (hints / ANNOUNCED).touch()


def saved(folder: str | os.PathLike[str], ckpt_dir: str | os.PathLike[str] | None = None) -> None:
    """This node wrote every file of `folder` (a top-level folder of `--ckpt-dir`, by path or
    name): its sync may commit the node's share once the files are uploaded."""
    hints = _hints(ckpt_dir)
    hints.mkdir(parents=True, exist_ok=True)
    name = Path(folder).name
    tmp = hints / f".{name}.tmp"
    tmp.write_text(f"{time.time()}\n")
    os.replace(tmp, hints / name)


def hinted(root: Path, unit: str, newest_mtime_ns: int) -> bool:
    """May a node commit `unit` now? Yes without `announce()`; with it, once `saved()` named
    the unit after its newest file was written."""
    hints = root / HINTS
    if not (hints / ANNOUNCED).exists():
        return True
    try:
        return (hints / unit).stat().st_mtime_ns >= newest_mtime_ns
    except OSError:
        return False
