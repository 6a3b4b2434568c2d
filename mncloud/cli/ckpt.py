"""`mncloud ckpt ls|verify|rm|pull`: look at and manage a run's checkpoints. No torch needed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mncloud.cli._common import console, handle_errors, print_json, print_whole
from mncloud.errors import CheckpointError, RunNotFoundError

if TYPE_CHECKING:  # the storage modules load pydantic: not for `mncloud --help`
    from mncloud.storage.checkpoints import CheckpointStore
    from mncloud.storage.folders import Verdict

app = typer.Typer(no_args_is_help=True, help="List, verify, pull and remove checkpoints.")

UriArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN|URL|DIR",
        help="A run's name, a checkpoint URL (s3://BUCKET/PREFIX, gs://…, file://…) or a "
        "local directory.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _store(where: str) -> CheckpointStore:
    from mncloud.storage.checkpoints import CheckpointStore

    return CheckpointStore(checkpoint_location(where))


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):  # a name too long
        return False


def checkpoint_location(where: str) -> str:
    """The checkpoint URL that RUN|URL|DIR names: a URL as given, a directory as `file://`,
    a run's name as the run's recorded checkpoint URL. CheckpointError when it names nothing
    that exists (a missing directory, an unknown run that is no directory either)."""
    from mncloud.storage.url import BucketURL

    if "://" in where:
        # Any bucket the cloud still serves, legacy S3 names (capitals, underscores) too; a
        # name no bucket can have (300 characters) is refused here, in one line.
        url = BucketURL.parse(where, check_name=False)
    elif "/" in where or where.startswith((".", "~")):
        url = BucketURL.directory(where)
    else:
        try:
            return _run_location(where)
        except RunNotFoundError as err:
            if not _is_dir(where):
                raise CheckpointError(
                    f"{err}, and there is no directory {where!r}; give a run name, a URL "
                    "(s3://…, gs://…, file://…) or a directory"
                ) from None
            url = BucketURL.directory(where)
    if url.scheme == "file" and not _is_dir(url.name):
        raise CheckpointError(f"no checkpoints at {where}: {url.name} does not exist")
    return str(url)


def _run_location(name: str) -> str:
    from mncloud.backends.registry import backend_for_run

    uri = backend_for_run(name).status(name).ckpt_uri
    if uri is None:
        raise CheckpointError(
            f"run {name!r} keeps no checkpoints (it was launched without a bucket)"
        )
    return uri


def ckpt_dir_units(ckpt_uri: str, retry_seconds: float = 5.0) -> list[Verdict]:
    """A run's `--ckpt-dir` units in the bucket: committed, or why not (`storage/folders.py`)."""
    from mncloud.storage.folders import survey

    return survey(ckpt_uri, retry_seconds)


def ckpt_dir_left(
    ckpt_uri: str, units: list[Verdict], retry_seconds: float = 5.0
) -> dict[str, str]:
    """The committed folders a restore leaves in the bucket → the newer one it brings
    (`storage/folderrestore.py`: the framework resumes from the newest)."""
    from mncloud import layout
    from mncloud.storage import open_bucket
    from mncloud.storage.folderrestore import left_in_bucket

    bucket, prefix = open_bucket(layout.ckpt_dir_uri(ckpt_uri), retry_seconds=retry_seconds)
    return left_in_bucket(bucket, prefix, units)


def _unit_row(u: Verdict, left: dict[str, str], stand_ins: dict[str, str]) -> list[str]:
    """One row of `ls`'s `--ckpt-dir` table: name, committed (or why not), files, size, age."""
    from rich.markup import escape

    if u.log:
        done = "yes (logs: restored file by file)"
    elif u.committed:
        done = "yes"
    elif u.reason.startswith("refused"):
        done = f"[red]{escape(u.reason)}[/], in the bucket, never restored"
    else:
        done = f"[yellow]incomplete[/]: {escape(u.reason)}"
    if u.name in left:
        done += f", in the bucket, not restored (a restore brings {escape(left[u.name])})"
    if u.name in stand_ins:
        done += f" (a restore puts a copy of {escape(stand_ins[u.name])} in its place)"
    count = str(len(u.files)) if u.committed or not u.folder else "?"
    kind = "/" if u.folder else ""
    return [f"{u.name}{kind}", done, count, _human(u.size), _age(u.mtime)]


def _ckpt_dir_table(uri: str) -> bool:
    """Print the `--ckpt-dir` units and the newest committed one; False when there are none."""
    from rich.table import Table

    from mncloud.storage.folderrestore import stand_ins_of
    from mncloud.storage.folders import newest_committed

    units = ckpt_dir_units(uri)
    if not units:
        return False
    folder = Table(
        "name", "committed", "files", "size", "age", title="--ckpt-dir folder",
        title_justify="left",
    )  # fmt: skip
    left, stand_ins = ckpt_dir_left(uri, units), stand_ins_of(units)
    for u in units:
        folder.add_row(*_unit_row(u, left, stand_ins))
    print_whole(folder)
    found = newest_committed(units)
    said = f"{found.name} (step {found.step})" if found else "none named by a step"
    console.print(
        f"newest committed checkpoint: {said}", markup=False, highlight=False, soft_wrap=True
    )
    return True


def describe_files(files: list[dict[str, Any]], most: int = 4) -> str:
    """`snapshot.pt (2.1 KB, 4s ago), …` for one line of `status` (each: key, size, mtime)."""
    shown = [f"{f['key']} ({_human(f['size'])}, {_age(f['mtime'])} ago)" for f in files[:most]]
    more = f", +{len(files) - most} more" if len(files) > most else ""
    return ", ".join(shown) + more


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _age(mtime: float) -> str:
    s = max(0.0, time.time() - mtime)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


@app.command("ls")
@handle_errors
def ls(uri: UriArg, json_out: JsonOpt = False) -> None:
    """List checkpoint steps: complete?, size, age."""
    store = _store(uri)
    steps = store.steps()
    if json_out:
        print_json(
            [
                {
                    "step": s.step,
                    "complete": s.complete,
                    "files": s.n_files,
                    "size_bytes": s.size,
                    "age_s": round(max(0.0, time.time() - s.mtime), 1),
                }
                for s in steps
            ]
        )
        return
    from rich.table import Table

    has_units = _ckpt_dir_table(store.uri)
    if not steps:
        if not has_units:
            console.print(
                f"no checkpoints at {store.uri}", markup=False, highlight=False, soft_wrap=True
            )
        return
    table = Table("step", "complete", "files", "size", "age")
    for s in steps:
        table.add_row(
            str(s.step),
            "yes" if s.complete else "[yellow]no[/]",
            str(s.n_files),
            _human(s.size),
            _age(s.mtime),
        )
    console.print(table)


@app.command("verify")
@handle_errors
def verify(
    uri: UriArg,
    step: Annotated[
        int | None, typer.Argument(help="Step to verify (default: every step).")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Check sizes only, not content hashes.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Verify COMPLETE, manifest, sizes and content hashes of one step or of all; exit 2 if a
    complete step is corrupt (or the named step does not verify)."""
    store = _store(uri)
    verdicts = (
        [store.verify(step, content=not quick)]
        if step is not None
        else store.verify_all(content=not quick)
    )
    if json_out:
        print_json([{"step": v.step, "ok": v.ok, "reason": v.reason} for v in verdicts])
    elif not verdicts:
        console.print(
            f"no checkpoints at {store.uri}", markup=False, highlight=False, soft_wrap=True
        )
    else:
        for v in verdicts:
            mark = "[green]ok[/]" if v.ok else f"[red]bad[/]: {v.reason}"
            console.print(f"step {v.step}: {mark}", soft_wrap=True)
    if step is not None and not verdicts[0].ok:
        raise CheckpointError(f"step {step} does not verify: {verdicts[0].reason}")
    corrupt = [v for v in verdicts if not v.ok and not v.reason.startswith("COMPLETE missing")]
    if step is None and corrupt:
        raise CheckpointError(
            f"{len(corrupt)} complete step(s) are corrupt: "
            + ", ".join(str(v.step) for v in corrupt)
        )


@app.command("rm")
@handle_errors
def rm(
    uri: UriArg,
    step: Annotated[int, typer.Argument(help="Step to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete one step (COMPLETE first, so it stops counting at once)."""
    store = _store(uri)
    steps = {s.step: s for s in store.steps()}
    if step not in steps:
        raise CheckpointError(f"no step {step} at {store.uri}")
    newest = max((s for s, info in steps.items() if info.complete), default=None)
    note = (
        " (the newest complete step: a resume would fall back to an older one)"
        if (step == newest)
        else ""
    )
    if not yes and not typer.confirm(
        f"Delete step {step} ({_human(steps[step].size)}) at {store.uri}{note}?", default=False
    ):
        raise typer.Exit(code=1)
    n = store.delete_step(step)
    console.print(f"deleted step {step} ({n} objects)")


@app.command("pull")
@handle_errors
def pull(
    uri: UriArg,
    step: Annotated[str, typer.Argument(help="Step to download, or 'latest'.")],
    dest: Annotated[Path, typer.Argument(help="Local directory to write the files into.")],
) -> None:
    """Download a verified step into DIR and check every file's size and content hash."""
    store = _store(uri)
    if step == "latest":
        latest, _ = store.latest()
        if latest is None:
            raise CheckpointError(f"no verified checkpoint at {store.uri}")
        number = latest
    else:
        try:
            number = int(step)
        except ValueError:
            raise CheckpointError(f"STEP must be a number or 'latest', not {step!r}") from None
    manifest = store.read_manifest(number)
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(f"step {number}", total=manifest.total_size)
        store.pull(number, dest, progress=lambda n: bar.advance(task, n))
    console.print(
        f"pulled step {number} ({len(manifest.files)} files, {_human(manifest.total_size)}) "
        f"into {dest}",
        soft_wrap=True,
    )
