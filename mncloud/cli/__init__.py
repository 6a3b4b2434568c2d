"""The `mncloud` command. Each command group lives in its own module; this one wires them.

Every way out goes through `_Group.main`, so the console script and `CliRunner` behave alike: an
`MncloudError` from the core or a bad option value (click's usage errors) is one line on stderr,
`error: …`, and exit code 2 — no usage panel, no traceback.

Help is plain text (`rich_markup_mode=None`): help strings are never parsed as markup, so
`s3://name[/prefix]`, `cpu:2` or `$` print as written with every Typer and rich version.

    up.py, follow.py     `up` (plan → render → launch), a local run followed in the foreground
    plan.py, plan_rows.py, plan_options.py   `plan`: the command, its rows as data, its options
    plan_tables.py       the plan as tables that fit 80 columns (`--wide` for the rest)
    render.py, profile.py, replay.py, gpus.py   `render`, `profile`, `replay`, `gpus`
    ops.py, exec.py, metrics.py   `status`, `logs`, `down`; `exec`; `metrics`
    runs.py, ckpt.py, export.py   `runs ls|show|cost`, `rerun`; `ckpt`; `export`
    doctor.py, chaos.py, control.py, ui.py   `doctor`, `chaos`, `control`, `ui`
    options.py, params.py, values.py   every option declared once, option groups and help
                         panels, option values turned into the core's models
    job_options.py       the job's options (everything a JobSpec is built from)
    _common.py           console output, JSON, one-line errors
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from mncloud import __version__
from mncloud.cli import chaos as chaos_cli
from mncloud.cli import ckpt as ckpt_cli
from mncloud.cli import control as control_cli
from mncloud.cli import exec as exec_cli
from mncloud.cli import export as export_cli
from mncloud.cli import gpus as gpus_cli
from mncloud.cli import metrics as metrics_cli
from mncloud.cli import ops as ops_cli
from mncloud.cli import plan as plan_cli
from mncloud.cli import profile as profile_cli
from mncloud.cli import render as render_cli
from mncloud.cli import replay as replay_cli
from mncloud.cli import runs as runs_cli
from mncloud.cli import ui as ui_cli
from mncloud.cli import up as up_cli
from mncloud.cli._common import one_line
from mncloud.cli.params import PlainFlagsGroup, use_panels
from mncloud.errors import MncloudError


def _click_class(name: str) -> type[Exception]:
    """click's exception class `name`, whether Typer uses click or (newer Typer) its own copy."""
    return next(k for k in typer.BadParameter.__mro__ if k.__name__ == name)


_ClickException = _click_class("ClickException")
_UsageError = _click_class("UsageError")


def _one_line(err: Exception) -> str:
    """A click error as one line: its message, then where to read the usage."""
    message = " ".join(err.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(err, "ctx", None)
    if isinstance(err, _UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


class _Group(PlainFlagsGroup):
    """The root group: turns errors into one line on stderr and an exit code."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except MncloudError as err:  # raised outside a command's own handler
            code = _fail(str(err))
        except _UsageError as err:
            if type(err).__name__ == "NoArgsIsHelpError":  # bare `mncloud` or `mncloud ckpt`
                typer.echo(err.ctx.get_help())  # type: ignore[attr-defined]
                code = 0
            else:
                code = _fail(_one_line(err))
        except _ClickException as err:
            code = _fail(_one_line(err), getattr(err, "exit_code", 1))
        except typer.Abort:  # click's Abort: Typer's own name for it either way
            code = _fail("aborted", 1)
        sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int = 2) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return code


app = typer.Typer(
    name="mncloud",
    cls=_Group,
    help="Train on many GPUs on the cheapest cloud; survive spot preemptions.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mncloud {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_version, is_eager=True
    ),
) -> None:
    """mncloud: plan, render, launch and operate multi-node training runs."""


render_cli.register(app)
plan_cli.register(app)
profile_cli.register(app)
gpus_cli.register(app)
up_cli.register(app)
exec_cli.register(app)
ops_cli.register(app)
metrics_cli.register(app)
runs_cli.register(app)
control_cli.register(app)
replay_cli.register(app)
export_cli.register(app)
ui_cli.register(app)
app.add_typer(ckpt_cli.app, name="ckpt", help="List, verify, pull and remove checkpoints.")
app.add_typer(chaos_cli.app, name="chaos", help="Preempt nodes or cut storage (local runs).")
use_panels(app)  # last: every command registered above lists its options in help panels


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`mncloud`): exits with the command's code."""
    app(args=argv, prog_name="mncloud")
