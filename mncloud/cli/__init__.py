"""The `mncloud` command. Each command group lives in its own module; this one wires them.

Core modules raise `MncloudError`; `main` turns one into a single line on stderr and exit 2.
"""

from __future__ import annotations

import sys

import typer

from mncloud import __version__
from mncloud.cli import chaos as chaos_cli
from mncloud.cli import ckpt as ckpt_cli
from mncloud.cli import ops as ops_cli
from mncloud.cli import plan as plan_cli
from mncloud.cli import render as render_cli
from mncloud.cli import runs as runs_cli
from mncloud.cli import up as up_cli
from mncloud.errors import MncloudError

app = typer.Typer(
    name="mncloud",
    help="Train on many GPUs on the cheapest cloud; survive spot preemptions.",
    no_args_is_help=True,
    add_completion=False,
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
up_cli.register(app)
ops_cli.register(app)
runs_cli.register(app)
app.add_typer(ckpt_cli.app, name="ckpt", help="List, verify, pull and remove checkpoints.")
app.add_typer(chaos_cli.app, name="chaos", help="Preempt nodes or cut storage (local runs).")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning MncloudError into exit code 2."""
    try:
        app(args=argv, prog_name="mncloud", standalone_mode=True)
    except MncloudError as err:  # raised outside a command's own handler
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
