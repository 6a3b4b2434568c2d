"""`mncloud export RUN|URI [STEP|latest] --out DIR|URL`: a verified checkpoint's model as
safetensors (or one torch file), with `export.json` beside it (`mncloud.export`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mncloud import constants
from mncloud.cli._common import console, err_console, handle_errors, print_json

if TYPE_CHECKING:
    from mncloud.export import ExportManifest

#: A progress bar is drawn for exports of at least this many tensor bytes.
PROGRESS_BYTES = 64 * 2**20

UriArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN|URI",
        help="A run's name, a checkpoint URL (s3://BUCKET/PREFIX, gs://…, file://…) or a "
        "local directory of checkpoints.",
        show_default=False,
    ),
]
StepArg = Annotated[
    str, typer.Argument(help="The step to export, or 'latest' (the newest complete one).")
]
OutOpt = Annotated[
    str,
    typer.Option(
        "--out",
        help="Where to write: a directory, or s3://… gs://… (a folder there). It must not "
        "exist or be empty, unless --overwrite.",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="safetensors (model.safetensors; shards with model.safetensors.index.json above "
        "--max-shard-size) or torch (one torch.save file, model.pt).",
    ),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="Convert floating-point tensors to bfloat16, float16 or float32 (default: as saved).",
    ),
]
OnlyOpt = Annotated[
    str,
    typer.Option("--only", help="The entry of the training state to export (model)."),
]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace what --out holds (only once all is written).")
]
ShardOpt = Annotated[
    str,
    typer.Option("--max-shard-size", help="Cut safetensors files at this size: 5GB, 500MB, 2GiB."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print export.json instead of a summary.")]


def register(app: typer.Typer) -> None:
    """Add `export` to the app."""
    app.command("export")(export_command)


@handle_errors
def export_command(
    uri: UriArg,
    step: StepArg = "latest",
    dest: OutOpt = "",
    fmt: FormatOpt = "safetensors",
    dtype: DtypeOpt = None,
    only: OnlyOpt = "model",
    overwrite: OverwriteOpt = False,
    max_shard_size: ShardOpt = "5GB",
    as_json: JsonOpt = False,
) -> None:
    """Export a complete, verified checkpoint's model as safetensors or one torch file.

    Reads every rank's shards of the step (never a torn one), keeps only the model (the
    optimizer and the rest stay out), converts the dtype if asked, and writes export.json
    beside it: source run, step, checkpoint manifest hash, dtype, each file's sha256.
    """
    from mncloud.export import ExportError, ExportFormat, parse_dtype, parse_size

    if not dest:
        raise ExportError("--out is required: a directory, or an s3:// or gs:// folder")
    options = {
        "fmt": ExportFormat.parse(fmt), "dtype": parse_dtype(dtype),
        "max_shard_bytes": parse_size(max_shard_size),
    }  # fmt: skip
    from mncloud.cli.ckpt import checkpoint_location

    location = checkpoint_location(uri)
    run = uri if "://" not in uri and location != _as_dir_url(uri) else None
    own_run = _own_run(location)
    from mncloud.export import export_checkpoint

    with _Bar() as bar:
        shown, manifest = export_checkpoint(
            location, step, dest, entry=only, overwrite=overwrite, progress=bar.update,
            run=run or (own_run[0] if own_run else None), **options,
        )  # fmt: skip
    if own_run is not None:
        _record(own_run, shown, manifest)
    if as_json:
        print_json(manifest.model_dump(mode="json"))
        return
    files = ", ".join(manifest.files)
    console.print(
        f"exported step {manifest.step} ({manifest.entry}, {manifest.tensors} tensors, "
        f"{manifest.tensor_bytes / 1e6:.1f} MB, {'/'.join(manifest.dtypes) or '-'}) "
        f"to {shown}: {files}, export.json",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _as_dir_url(where: str) -> str | None:
    from mncloud.storage.url import BucketURL

    try:
        return str(BucketURL.directory(where))
    except (OSError, RuntimeError, ValueError):
        return None


def _own_run(location: str) -> tuple[str, str] | None:
    """(name, run id) when this export runs inside that run, on its own checkpoints
    (`up --export-on-finish`: node 0's run script), else None."""
    name, run_id = os.environ.get(constants.RUN_NAME_ENV), os.environ.get(constants.RUN_ID_ENV)
    if name and run_id and os.environ.get(constants.CKPT_URI_ENV) == location:
        return name, run_id
    return None


def _record(run: tuple[str, str], shown: str, manifest: ExportManifest) -> None:
    """The export as an event in the run's record (see `records.store.record_export`)."""
    from mncloud.records.store import record_export

    detail = f"{manifest.format.value} {manifest.dtype or 'as saved'} → {shown}"
    record_export(run[0], run[1], manifest.source, step=manifest.step, detail=detail)


class _Bar:
    """A rich progress bar on stderr for a large export (download, then write)."""

    def __init__(self) -> None:
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, phase: str, done: int, total: int) -> None:
        if total < PROGRESS_BYTES:
            return
        if self._progress is None:
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

            self._progress = Progress(
                "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                TimeRemainingColumn(), console=err_console, transient=True,
            )  # fmt: skip
            self._progress.start()
        if phase not in self._tasks:
            self._tasks[phase] = self._progress.add_task(phase, total=total)
        self._progress.update(self._tasks[phase], completed=done)
