"""What a node's `--ckpt-dir` restore brings from the bucket, whether it fits, how it lands.

**What.** Of the committed units (`folders.judge`), a folder its framework rotates by step
(`frameworkdirs.rotated`: the Trainer's `checkpoint-N/`, torchtitan's `step-N/`) is restored
only if it is the newest of its family, or the best the Trainer names in that newest one's
`trainer_state.json` (`best_model_checkpoint`): the framework resumes from the newest and
needs no other. The older ones stay in the bucket (`left`), listed by `ckpt ls` as "in the
bucket, not restored", and go when the framework's rotation passes them (`foldersync`).
Every other unit is restored, as before: one-file units (`snapshot.pt`, Lightning's
`last.ckpt`), Lightning's `.ckpt` files and folders (its `ModelCheckpoint` keeps the top-k by
a metric recorded inside them), any other name (`final/`, `runs/`).

    bucket: checkpoint-10 … checkpoint-50 (best: checkpoint-20), snapshot.pt, checkpoint-60 (torn)
    node:   checkpoint-20, checkpoint-50, snapshot.pt; left: checkpoint-10, -30, -40; aside: -60

If the newest is refused (a file fails its hash, reads short or is gone mid-restore), the next
older one is fetched then (and its best), the refused one recorded in `refused.json` as before.
A one-file unit is checked against its record the same way, and refused the same way (never
restored, left in the bucket, recorded); a refused Lightning `last.ckpt` gets the newest
`epoch=…-step=….ckpt` restored copied under its name (`stand_ins`: `fit(ckpt_path="last")`
looks for no other file). A logger's folder (`folders.LOG_FOLDERS`) is restored file by file:
one that fails is left out and named, the others land.

**Room.** Before a byte is fetched, the bytes to land (each file rounded up to 4 KiB) plus
`RESERVE` are compared with the free space of the node's folder: too little is `NoRoom`, one
line with both sizes and the path; the VM's process exits 2 and its node refuses (never
retried), and the local backend fails the run with that line.

**Landing.** A unit's files are fetched into `.mncloud-restoring-<unit>` (a name never synced
nor read by a framework) in parallel (`transfer.fetch`), checked against its markers, and
renamed onto `<unit>` once whole, its time set to the bucket's (the Trainer rotates by folder
time); a refused unit's copy is removed: nothing on the node is half-restored.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from mncloud.errors import MncloudError, StorageError
from mncloud.storage import transfer
from mncloud.storage.buckets import Bucket
from mncloud.storage.folders import Verdict, refused_key
from mncloud.storage.frameworkdirs import (
    LIGHTNING_LAST,
    TRAINER_STATE,
    entry_step,
    named_best,
    newest,
    rotated,
)
from mncloud.storage.url import join_key

MiB = 1024 * 1024
RESERVE = 64 * MiB
"""Free space a restore leaves beyond what it lands (logs, the framework's first writes)."""
BLOCK = 4096
"""Each file is counted in whole blocks of this size."""
LANDING = ".mncloud-restoring-"
"""Prefix of the folder a unit is fetched into before it is renamed into place."""


class NoRoom(StorageError):
    """The node's disk cannot hold what the restore would land."""


@dataclass
class Plan:
    """The committed units by how a restore treats them."""

    always: list[Verdict] = field(default_factory=list)
    chains: dict[str, list[Verdict]] = field(default_factory=dict)
    """A rotated family (`checkpoint`, `step`) → its committed folders, newest first."""
    aside: dict[str, str] = field(default_factory=dict)
    """Units not committed → why."""


def plan(verdicts: list[Verdict]) -> Plan:
    """Sort the units of a `judge` into restored-whatever, rotated families and aside."""
    out = Plan()
    for v in verdicts:
        found = rotated(v.name) if v.folder else None
        if not v.committed:
            out.aside[v.name] = v.reason
        elif found is None:
            out.always.append(v)
        else:
            out.chains.setdefault(found.family, []).append(v)
    for chain in out.chains.values():
        chain.sort(key=lambda v: rotated(v.name).step, reverse=True)  # type: ignore[union-attr]
    return out


def best_of(bucket: Bucket, prefix: str, v: Verdict, chain: list[Verdict]) -> Verdict | None:
    """The committed folder of `chain` that `v`'s `trainer_state.json` names as the best."""
    if TRAINER_STATE not in v.files:
        return None
    try:
        name = named_best(bucket.get_bytes(join_key(prefix, v.name, TRAINER_STATE)))
    except StorageError:
        return None  # its restore will say what is wrong with it
    return next((u for u in chain if u.name == name and u is not v), None)


def landed_bytes(units: list[Verdict]) -> int:
    """What these units take on a disk: each file rounded up to whole blocks."""
    return sum(-(-size // BLOCK) * BLOCK for v in units for size, _ in v.files.values())


def first_choice(bucket: Bucket, prefix: str, verdicts: list[Verdict]) -> list[Verdict]:
    """The units a restore lands when nothing is refused."""
    p = plan(verdicts)
    units = list(p.always)
    for chain in p.chains.values():
        best = best_of(bucket, prefix, chain[0], chain)
        units += [chain[0], *([best] if best else [])]
    return units


def resume_unit(units: list[Verdict]) -> Verdict | None:
    """The unit a framework resumes from among those restored: the highest step its name
    carries (`checkpoint-40`, `epoch=4-step=40.ckpt`), else the newest by time (`ckpt.pt`);
    never a logger's folder."""
    units = [v for v in units if not v.log]
    stepped = [(step, v) for v in units if (step := entry_step(v.name)) is not None]
    if stepped:
        return max(stepped, key=lambda sv: sv[0])[1]
    return max(units, key=lambda v: v.mtime, default=None)


def human(n: float) -> str:
    """`96.3 GB`, `12.0 MB`, `512 B`."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def ensure_room(
    root: Path, need: int, what: str, remedy: str = "give the nodes more disk (--disk-size)"
) -> None:
    """NoRoom (one line: both sizes and the path) unless `root`'s file system has `need`
    bytes free and `RESERVE` to spare."""
    free = shutil.disk_usage(root).free
    if free < need + RESERVE:
        raise NoRoom(
            f"--ckpt-dir {root} has {human(free)} free: too little to restore {human(need)} "
            f"({what}) with {human(RESERVE)} to spare; nothing was downloaded: {remedy}"
        )


def describe(units: list[Verdict]) -> str:
    """`checkpoint-50, checkpoint-20 and 2 file(s)`."""
    names = [v.name for v in units if v.folder]
    files = sum(not v.folder for v in units)
    parts = names + ([f"{files} file(s)"] if files else [])
    return ", ".join(parts) if parts else "nothing"


@dataclass
class Restored:
    """What a restore placed on the node and what it did not."""

    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Path in the node's folder → (size, xxh3_128; "" for a one-file unit's)."""
    units: list[Verdict] = field(default_factory=list)
    aside: dict[str, str] = field(default_factory=dict)
    """Units not restored because something is wrong with them → why."""
    left: dict[str, str] = field(default_factory=dict)
    """Committed folders left in the bucket → the newer one of their family restored."""
    stand_ins: dict[str, str] = field(default_factory=dict)
    """A refused Lightning `last.ckpt` → the `.ckpt` file copied under its name."""

    def counts(self) -> tuple[int, int]:
        """(folders, top-level files) restored."""
        folders = sum(v.folder for v in self.units)
        return folders, len(self.units) - folders


class _Restore:
    def __init__(self, bucket: Bucket, prefix: str, root: Path, node: int) -> None:
        self.bucket, self.prefix, self.root, self.node = bucket, prefix, root, node
        self.out = Restored()

    def chain(self, chain: list[Verdict]) -> None:
        """The newest folder that lands (and its best); the older ones are left."""
        chosen = None
        for i, v in enumerate(chain):
            best = best_of(self.bucket, self.prefix, v, chain)
            wanted = [u for u in (best, v) if u is not None and not self.tried(u)]
            if i > 0:  # a fallback: what the refused one freed is free again
                ensure_room(self.root, landed_bytes(wanted), describe(wanted))
            if best is not None and not self.tried(best):
                self.land(best)  # first: the older folder gets the older time
            if self.land(v):
                chosen = v
                break
        for v in chain:
            if chosen is not None and not self.tried(v):
                self.out.left[v.name] = chosen.name

    def tried(self, v: Verdict) -> bool:
        return v in self.out.units or v.name in self.out.aside

    def land(self, v: Verdict) -> bool:
        """Fetch one unit beside its place, check it, rename it into place (a logger's
        folder: the files that pass)."""
        landing = self.root / f"{LANDING}{v.name}"
        wants = [
            transfer.Want(join_key(self.prefix, v.name, rel),
                          landing / rel if rel else landing, size, rel or v.name)
            for rel, (size, _) in sorted(v.files.items())
        ]  # fmt: skip
        if v.log:
            digests = self.fetch_logs(v, wants)
        else:
            try:
                digests = transfer.fetch(self.bucket, wants)
            except transfer.BadObject as err:
                return self.refuse(v, f"refused: {v.name}/{err}" if v.folder else f"refused: {err}")
            why = _mismatch(v, digests)
            if why is not None:
                return self.refuse(v, why)
        target = self.root / v.name
        os.replace(landing, target)
        with contextlib.suppress(OSError):
            os.utime(target, (v.mtime, v.mtime))
        for rel, (size, _) in v.files.items():
            if (key := rel or v.name) in digests:
                self.out.files[f"{v.name}/{rel}" if rel else v.name] = (size, digests[key])
        self.out.units.append(v)
        return True

    def refuse(self, v: Verdict, why: str) -> bool:
        """Leave `v` out: its copy removed, its refusal recorded in the bucket (`ckpt ls`)."""
        _remove(self.root / f"{LANDING}{v.name}")
        self.out.aside[v.name] = why
        refuse(self.bucket, self.prefix, v.name, why, self.node)
        return False

    def fetch_logs(self, v: Verdict, wants: list[transfer.Want]) -> dict[str, str]:
        """A logger's files: each one that reads short, is gone or fails the hashes its markers
        give it is left out (in the bucket, named in `aside`), the others kept."""
        while True:
            try:
                digests = transfer.fetch(self.bucket, wants)
                break
            except transfer.BadObject as err:
                self.out.aside[f"{v.name}/{err.rel}"] = f"refused: {v.name}/{err}"
                (self.root / f"{LANDING}{v.name}" / err.rel).unlink(missing_ok=True)
                wants = [w for w in wants if w.rel != err.rel]
        for rel, (_size, hashes) in sorted(v.files.items()):
            if rel in digests and hashes and digests[rel] not in hashes:
                self.out.aside[f"{v.name}/{rel}"] = _hash_fails(v, rel, digests[rel])
                (self.root / f"{LANDING}{v.name}" / rel).unlink(missing_ok=True)
                del digests[rel]
        (self.root / f"{LANDING}{v.name}").mkdir(parents=True, exist_ok=True)
        return digests

    def stand_in(self) -> None:
        """Lightning's `last.ckpt` refused: the newest `.ckpt` file restored by its step is
        copied under its name (its room checked first), so that `fit(ckpt_path="last")`
        resumes from it."""
        files = {u.name: u for u in self.out.units if not u.folder and u.name.endswith(".ckpt")}
        found = newest(files)
        for name in sorted(self.out.aside):
            if found is None or not LIGHTNING_LAST.match(name):
                continue
            source, copy = self.root / found.name, self.root / name
            ensure_room(self.root, landed_bytes([files[found.name]]), f"a copy of {found.name}")
            shutil.copyfile(source, copy)
            shutil.copystat(source, copy)
            self.out.stand_ins[name] = found.name


def _hash_fails(v: Verdict, rel: str, digest: str) -> str:
    where = f"{v.name}/{rel}" if rel else v.name
    return f"refused: {where} fails its content hash (xxh3_128 {digest})"


def _mismatch(v: Verdict, digests: dict[str, str]) -> str | None:
    for rel, (_size, hashes) in sorted(v.files.items()):
        digest = digests[rel or v.name]
        if hashes and digest not in hashes:
            return _hash_fails(v, rel, digest)
    return None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def refuse(bucket: Bucket, prefix: str, unit: str, why: str, node: int) -> None:
    """Record a refusal beside the folder's markers (`ckpt ls` shows it); delete nothing."""
    body = json.dumps({"reason": why, "t": time.time(), "node": node}).encode()
    with contextlib.suppress(MncloudError):
        bucket.put_bytes(refused_key(prefix, unit), body)


def restore_units(
    bucket: Bucket, prefix: str, root: Path, verdicts: list[Verdict], node: int
) -> Restored:
    """Land what the module docstring says into the empty folder `root`; NoRoom first if it
    cannot fit. A failure of the bucket itself (unreachable after its retries) is raised."""
    p = plan(verdicts)
    first = first_choice(bucket, prefix, verdicts)
    ensure_room(root, landed_bytes(first), describe(first))
    job = _Restore(bucket, prefix, root, node)
    job.out.aside.update(p.aside)
    try:
        for v in p.always:
            job.land(v)
        for chain in p.chains.values():
            job.chain(chain)
        job.stand_in()
    finally:
        for landing in root.glob(f"{LANDING}*"):
            _remove(landing)
    return job.out


def left_in_bucket(bucket: Bucket, prefix: str, verdicts: list[Verdict]) -> dict[str, str]:
    """The committed folders a restore would leave in the bucket → the newer one it brings."""
    chosen = {v.name for v in first_choice(bucket, prefix, verdicts)}
    out = {}
    for chain in plan(verdicts).chains.values():
        for v in chain[1:]:
            if v.name not in chosen:
                out[v.name] = chain[0].name
    return out


def stand_ins_of(verdicts: list[Verdict]) -> dict[str, str]:
    """A Lightning `last.ckpt` that is not committed (refused) → the file a restore copies in
    its place: the newest committed `epoch=…-step=….ckpt` (as `_Restore.stand_in`)."""
    source = newest(
        v.name for v in verdicts if v.committed and not v.folder and v.name.endswith(".ckpt")
    )
    if source is None:
        return {}
    return {
        v.name: source.name
        for v in verdicts
        if not v.committed and not v.folder and LIGHTNING_LAST.match(v.name)
    }
