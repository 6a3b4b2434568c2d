"""Rerun: rebuild a recorded run's code in a git worktree and the request to launch it again.

The tree is the record's commit plus its stored diff plus the untracked files whose sha256
still matches in the current checkout; the current checkout is never modified. The request is
the recorded JobSpec, validated directly from its JSON (no round trip through CLI options),
with its paths moved into the worktree, and the recorded LaunchOptions: every option of the
original `up` is kept. Whatever cannot be rebuilt exactly is refused with one line.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from mncloud import layout
from mncloud.records.lineage import git, repo_root, sha256_file
from mncloud.records.model import GitInfo, RecordError, RunRecord, UntrackedFile
from mncloud.records.store import load_diff
from mncloud.redact import REDACTED
from mncloud.spec import DEFAULT_HOURS, JobSpec
from mncloud.spec.launch import LaunchOptions


class RerunSetup(BaseModel):
    """A reconstructed working tree and the request to launch the recorded run from it."""

    worktree: Path
    workdir: Path
    spec: JobSpec
    """The recorded spec, its script, workdir and requirements inside the worktree."""
    launch_options: LaunchOptions
    """The recorded launch options (a template inside the repository rebased too)."""
    restored_untracked: list[str] = Field(default_factory=list)
    skipped_untracked: list[str] = Field(default_factory=list)


def prepare_rerun(
    record: RunRecord,
    dest: Path | None = None,
    *,
    name: str | None = None,
    repo: Path | None = None,
    env_overrides: Mapping[str, str] | None = None,
    skip_untracked: bool = False,
) -> RerunSetup:
    """Rebuild the run's code in a new git worktree at `dest`: its commit + its stored diff.

    `name` renames the new run (default: the recorded name); `dest` defaults to
    `layout.rerun_dir(name)`. `repo` is the repository to take the commit from (default: the
    current directory's, else the recorded root). Untracked files are copied from that checkout
    only if their sha256 still matches. Raises RecordError with one line whenever the run
    cannot be rebuilt exactly; the current checkout is never modified.
    """
    g = _rebuildable(record)
    name = name or record.name
    dest = dest or layout.rerun_dir(name)
    root = _source_repo(g, repo)
    envs = _envs(record.spec, env_overrides)
    _refuse_redacted(record, envs)
    diff = load_diff(record)
    if g.diff_sha256 and hashlib.sha256(diff).hexdigest() != g.diff_sha256:
        raise RecordError(f"the stored diff of run {record.run_id} does not match its sha256")
    restore, skipped = _untracked_plan(g, root, skip_untracked)
    if dest.exists():
        raise RecordError(f"{dest} already exists; choose another --name or remove it")
    _build_tree(record.run_id, g, root, dest, diff, restore)
    workdir = dest / g.workdir
    return RerunSetup(
        worktree=dest,
        workdir=workdir,
        spec=_rebased_spec(record.spec, workdir, name=name, envs=envs),
        launch_options=_rebased_options(record, Path(g.root), dest),
        restored_untracked=[item.path for item, _ in restore],
        skipped_untracked=skipped,
    )


def _rebuildable(record: RunRecord) -> GitInfo:
    """The record's GitInfo, if its tree can be rebuilt exactly."""
    g = record.git
    if g is None:
        raise RecordError(
            f"run {record.run_id} was not launched from a git repository; there is no commit "
            "to rebuild its code from"
        )
    if g.commit is None:
        raise RecordError(f"run {record.run_id} was launched before the repository's first commit")
    if g.diff_redacted:
        raise RecordError(
            f"run {record.run_id}'s uncommitted diff contained secrets and was stored scrubbed; "
            "it cannot be re-applied exactly"
        )
    return g


def _source_repo(g: GitInfo, repo: Path | None) -> Path:
    """The repository holding the run's commit: `repo`, the current one, or the recorded root."""
    recorded = Path(g.root) if Path(g.root).is_dir() else None
    start = repo or repo_root(Path.cwd()) or recorded
    root = repo_root(start) if start is not None else None
    if root is None:
        raise RecordError(
            "not inside a git repository: run `mncloud rerun` from a clone of the run's project"
        )
    try:
        git(root, "cat-file", "-e", f"{g.commit}^{{commit}}")
    except RecordError:
        raise RecordError(
            f"commit {(g.commit or '')[:12]} is not in {root}; "
            f"fetch it first (git fetch origin {g.commit})"
        ) from None
    return root


def _envs(spec: Mapping[str, Any], overrides: Mapping[str, str] | None) -> dict[str, str]:
    """The recorded `--env` values with `overrides` applied; a redacted one must be given."""
    envs = dict(spec.get("envs") or {})
    for key, value in envs.items():
        if REDACTED in value and key not in (overrides or {}):
            raise RecordError(
                f"--env {key} was redacted in the record; pass it again: --env {key}=VALUE"
            )
    return envs | dict(overrides or {})


def _refuse_redacted(record: RunRecord, envs: Mapping[str, str]) -> None:
    """Refuse a spec or options that had secrets scrubbed out of anything but `--env`."""
    for field, value in {**record.spec, "envs": envs, **record.launch_options}.items():
        if REDACTED in str(value):
            raise RecordError(
                f"the record of run {record.run_id} had a secret scrubbed out of its {field}; "
                "it cannot be relaunched exactly"
            )


def _untracked_plan(
    g: GitInfo, root: Path, skip: bool
) -> tuple[list[tuple[UntrackedFile, Path]], list[str]]:
    """Untracked files to copy (unchanged since the run) and those skipped (with `skip`)."""
    restore: list[tuple[UntrackedFile, Path]] = []
    skipped: list[str] = []
    for item in g.untracked:
        source = root / item.path
        ok = source.is_file() and item.sha256 is not None and sha256_file(source) == item.sha256
        if ok:
            restore.append((item, source))
        elif skip:
            skipped.append(item.path)
        else:
            why = "missing" if not source.is_file() else "changed since the run"
            raise RecordError(
                f"untracked file {item.path} is {why}; restore it or pass --skip-untracked"
            )
    return restore, skipped


def _build_tree(
    run_id: str,
    g: GitInfo,
    root: Path,
    dest: Path,
    diff: bytes,
    restore: list[tuple[UntrackedFile, Path]],
) -> None:
    """`git worktree add` the commit at `dest`, apply the diff, copy the untracked files."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(root, "worktree", "add", "--detach", "--quiet", str(dest), g.commit or "")
    try:
        if diff:
            patch = dest.parent / f".{dest.name}.patch"
            patch.write_bytes(diff)
            try:
                git(dest, "apply", "--binary", "--whitespace=nowarn", str(patch))
            finally:
                patch.unlink(missing_ok=True)
        for item, source in restore:
            target = dest / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    except RecordError as err:
        with contextlib.suppress(Exception):
            git(root, "worktree", "remove", "--force", str(dest))
        raise RecordError(f"could not rebuild run {run_id}'s tree: {err}") from None


def _rebase(path: Path, old: Path, new: Path) -> Path:
    """`path` moved from under `old` to under `new` (unchanged when it was not under `old`)."""
    return new / path.relative_to(old) if path.is_relative_to(old) else path


def _rebased_spec(
    spec: Mapping[str, Any], workdir: Path, *, name: str, envs: Mapping[str, str]
) -> JobSpec:
    """The recorded JobSpec with its paths inside the rebuilt `workdir`."""
    old_workdir = Path(spec["workdir"])
    data = dict(spec) | {
        "name": name,
        "envs": dict(envs),
        "workdir": workdir,
        "script": _rebase(Path(spec["script"]), old_workdir, workdir),
    }
    if spec.get("requirements"):  # relative to workdir; an absolute one moves with it
        data["requirements"] = _rebase(Path(spec["requirements"]), old_workdir, workdir)
    return JobSpec.model_validate(data)


def _rebased_options(record: RunRecord, old_root: Path, new_root: Path) -> LaunchOptions:
    """The recorded LaunchOptions; a template in the repository is taken from the worktree.

    A record without options (written before they were stored) gets the plan's hours and
    budget, the rest default.
    """
    data = dict(record.launch_options)
    if not data:
        request = (record.plan or {}).get("request") or {}
        data = {"hours": request.get("hours") or DEFAULT_HOURS, "max_cost": request.get("max_cost")}
    options = LaunchOptions.model_validate(data)
    if options.template is not None:
        moved = _rebase(options.template, old_root, new_root)
        if moved.is_file():
            options = options.model_copy(update={"template": moved})
    return options
