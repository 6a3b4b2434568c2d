"""`mncloud doctor`: check credentials, bucket and data paths from the laptop before a launch.

The node-side half runs inside the job (`python -m mncloud.doctor node`, see mncloud/doctor/).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json, print_whole
from mncloud.errors import SpecError

if TYPE_CHECKING:
    from mncloud.doctor import Check


def register(app: typer.Typer) -> None:
    """Add `doctor` to the app."""
    app.command("doctor")(doctor_command)


@handle_errors
def doctor_command(
    script: Annotated[
        Path | None, typer.Argument(help="Your training script (its mncloud.yaml gives defaults).")
    ] = None,
    gpus: opts.Gpus = None,
    cloud: opts.Cloud = None,
    bucket: opts.Bucket = None,
    require_path: opts.RequirePath = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            max=600.0,
            help="Seconds allowed for each cloud's credential check.",
        ),
    ] = 20.0,
    as_json: opts.Json = False,
    bandwidth_of: Annotated[
        str | None,
        typer.Option(
            "--bandwidth",
            metavar="RUN",
            help="Run the all-reduce bandwidth test alone across a run's nodes (a local run's, "
            "or a live --cluster's).",
        ),
    ] = None,
    min_bandwidth: opts.MinBandwidth = None,
) -> None:
    """Check credentials, bucket and data paths now, instead of at a stuck rendezvous.

    s3:// and gs:// --require-path paths are checked here; local ones on every node at start.
    """
    from mncloud import doctor

    if bandwidth_of is not None:
        _bandwidth(bandwidth_of, min_bandwidth, timeout)
        return

    if not math.isfinite(timeout):
        raise SpecError(f"--timeout {timeout:g}: give a number of seconds, e.g. 20")
    checks = _laptop_checks(script, gpus, cloud, bucket, require_path or [], timeout)
    bad = doctor.failures(checks)
    if as_json:
        print_json([c.__dict__ for c in checks])
    else:
        table = Table(title="mncloud doctor", show_lines=False)
        for col in ("", "check", "detail"):
            table.add_column(col)
        for c in checks:
            table.add_row(
                "[green]ok[/]" if c.ok else "[red]FAIL[/]", escape(c.name), escape(c.detail)
            )
        print_whole(table)
        for c in bad:
            console.print(f"[red]✗[/] {escape(c.detail)}", soft_wrap=True)
    if bad:
        raise typer.Exit(code=1)


def _bandwidth(run_name: str, min_bandwidth: float | None, timeout: float) -> None:
    """`doctor --bandwidth RUN`: the preflight's bandwidth test alone on the run's nodes."""
    from mncloud.backends.registry import backend_name_of, get_backend

    if min_bandwidth is not None and not (math.isfinite(min_bandwidth) and min_bandwidth > 0):
        raise SpecError(f"--min-bandwidth {min_bandwidth:g} must be a positive number of GB/s")
    backend = get_backend(backend_name_of(run_name))  # RunNotFoundError: an unknown name
    passed, lines = backend.measure_bandwidth(run_name, min_bandwidth, max(timeout, 30.0))
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)
    if not passed:
        raise typer.Exit(code=1)


def _laptop_checks(
    script: Path | None,
    gpus: str | None,
    cloud: list[str] | None,
    bucket: str | None,
    require_paths: list[str],
    timeout: float,
) -> list[Check]:
    """Every check `mncloud doctor` runs, with the project's mncloud.yaml as defaults."""
    from mncloud import doctor
    from mncloud.options import JobOptions
    from mncloud.request import as_list, find_workdir, is_file, project_options
    from mncloud.spec import Accelerator

    checks: list[Check] = []
    config = JobOptions()
    if script is not None:
        if not is_file(script):
            checks.append(doctor.Check("script", False, f"{script} does not exist"))
        else:
            workdir = find_workdir(script.resolve())
            config = project_options(workdir)
            digest = doctor.code_hash(workdir)
            checks.append(doctor.Check("code", True, f"{workdir}: code hash {digest}"))
    gpus = gpus or config.gpus
    if gpus:
        try:
            checks.append(doctor.Check("gpus", True, f"{Accelerator.parse(str(gpus))} is known"))
        except Exception as err:  # SpecError: an unknown accelerator name
            checks.append(doctor.Check("gpus", False, str(err)))
    clouds = list(cloud or []) or as_list(config.cloud)
    if clouds:
        checks += doctor.check_credentials(clouds, timeout=timeout)
    else:
        checks.append(doctor.Check("credentials", True, "no --cloud given: nothing to check"))
    bucket = bucket or config.bucket
    if bucket:
        checks.append(doctor.check_bucket(str(bucket)))
    for path in require_paths:
        if "://" in path:
            checks.append(doctor.check_path(path))
        else:
            checks.append(
                doctor.Check("path", True, f"{path}: checked on every node when the job starts")
            )
    return checks
