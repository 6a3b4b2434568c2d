"""Lineage: the code and environment a run was launched from.

The git commit, a sha256 and a copy of `git diff HEAD --binary` (tracked changes, staged or
not), the untracked files with their sha256 (they are not in the diff; `rerun` copies them from
the current checkout only when their hashes still match), and the launching environment's
packages (`importlib.metadata`, no `pip freeze` subprocess). A diff that needed scrubbing cannot
be re-applied faithfully: its GitInfo says so (`diff_redacted`) and `rerun` refuses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
from pathlib import Path
from typing import Any

from mncloud.records.model import GitInfo, RecordError, UntrackedFile
from mncloud.redact import Redactor

#: Untracked files above this size are listed without a hash (and cannot be restored).
MAX_HASHED_FILE = 32 * 1024 * 1024


def git(root: Path, *args: str, binary: bool = False) -> Any:
    """Run `git -C root ARGS`; its stdout (text, or bytes with `binary`). RecordError on failure."""
    proc = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RecordError(f"git {' '.join(args)} failed in {root}: {lines[-1] if lines else ''}")
    return proc.stdout if binary else proc.stdout.decode(errors="replace").strip()


def repo_root(start: Path) -> Path | None:
    """The top of the git repository holding `start`, or None outside git."""
    try:
        return Path(git(start, "rev-parse", "--show-toplevel"))
    except (RecordError, OSError, subprocess.TimeoutExpired):
        return None


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def capture_git(workdir: Path, redactor: Redactor | None = None) -> tuple[GitInfo | None, bytes]:
    """The git state of `workdir`'s repository and the diff to store; (None, b"") outside git."""
    redactor = redactor or Redactor()
    root = repo_root(workdir)
    if root is None:
        return None, b""
    commit: str | None
    try:
        commit = git(root, "rev-parse", "--verify", "HEAD")
    except RecordError:
        commit = None
    branch = remote = None
    with contextlib.suppress(RecordError):
        branch = git(root, "rev-parse", "--abbrev-ref", "HEAD") or None
    with contextlib.suppress(RecordError):
        remote = redactor.scrub(git(root, "remote", "get-url", "origin")) or None
    diff = git(root, "diff", "HEAD", "--binary", binary=True) if commit else b""
    stored, redacted = _scrubbed_diff(diff, redactor)
    try:
        rel_workdir = Path(workdir).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel_workdir = "."
    info = GitInfo(
        root=str(root),
        commit=commit,
        branch=branch,
        remote=remote,
        diff_sha256=hashlib.sha256(diff).hexdigest() if diff else None,
        diff_bytes=len(diff),
        diff_redacted=redacted,
        untracked=_untracked(root, redactor),
        workdir=rel_workdir,
    )
    return info, stored


def _untracked(root: Path, redactor: Redactor) -> list[UntrackedFile]:
    """Files git neither tracks nor ignores, with their sha256 (None when too big)."""
    raw = git(root, "ls-files", "--others", "--exclude-standard", "-z", binary=True)
    found = []
    for rel in raw.decode(errors="replace").split("\0"):
        if not rel:
            continue
        path = root / rel
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            digest = sha256_file(path) if size <= MAX_HASHED_FILE else None
            found.append(UntrackedFile(path=redactor.scrub(rel), size=size, sha256=digest))
    return found


def _scrubbed_diff(diff: bytes, redactor: Redactor) -> tuple[bytes, bool]:
    """The diff as it may be stored, and whether secrets had to be scrubbed out of it."""
    if not diff:
        return diff, False
    text = diff.decode(errors="surrogateescape")
    scrubbed = redactor.scrub(text)
    if scrubbed == text:
        return diff, False
    return scrubbed.encode(errors="surrogateescape"), True


def installed_packages() -> dict[str, str]:
    """`name → version` of every distribution in this environment (like `pip freeze`)."""
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))
