"""The `mncloud` command. Each command group lives in its own module; this one wires them.

The wiring is a table (`COMMANDS`: name → module, help line), so `mncloud --help` lists every
command without importing one, and `mncloud CMD …` imports CMD's module and builds CMD alone.

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

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import typer
import typer.main
from typer.core import TyperCommand

from mncloud import __version__
from mncloud.cli.params import PlainFlagsGroup, use_panels
from mncloud.errors import MncloudError


class _Entry(NamedTuple):
    """A root command as data: its module, its help line, whether help lists it."""

    module: str
    #: The help as a command listing shows it at 80 columns (click's `get_short_help_str(80)`):
    #: the most a listing here shows (help is at most 80 wide); tests/test_help.py holds it.
    summary: str
    hidden: bool = False
    #: The module's Typer `app` is the command (a group with `summary` as its help); otherwise
    #: the module's `register(app)` adds it.
    group: bool = False


#: The root's commands in the order help lists them: `mncloud --help` reads this, and only
#: `mncloud CMD …` imports CMD's module (a module that registers several is filtered to CMD).
COMMANDS: dict[str, _Entry] = {
    "render": _Entry(
        "mncloud.cli.render",
        "Print the SkyPilot task YAML for SCRIPT, validated by SkyPilot's own schema.",
    ),
    "plan": _Entry(
        "mncloud.cli.plan", "Rank clouds, regions and instance types by expected cost to finish,..."
    ),
    "profile": _Entry(
        "mncloud.cli.profile",
        "Run a few steps of the script in one process here, count one step's FLOPs,...",
    ),
    "gpus": _Entry(
        "mncloud.cli.gpus",
        "List the accelerators --gpus takes (NAME:COUNT per node), the clouds that...",
    ),
    "up": _Entry(
        "mncloud.cli.up",
        "Plan, render and launch SCRIPT on the cheapest fitting cloud (or --cloud local).",
    ),
    "exec": _Entry(
        "mncloud.cli.exec",
        "Run NAME's task again on its live cluster (`up --cluster`) or its local...",
    ),
    "status": _Entry(
        "mncloud.cli.ops",
        "Show runs: state, where, nodes, restarts, newest checkpoint, cost so far,...",
    ),
    "logs": _Entry(
        "mncloud.cli.ops",
        "Print the run's output from all nodes, each line prefixed with node and rank.",
    ),
    "down": _Entry(
        "mncloud.cli.ops",
        "Stop the run and release its nodes; returns once nothing of the run is left.",
    ),
    "metrics": _Entry(
        "mncloud.cli.metrics",
        "Print the metrics a run's script reports through mncloud.train (loss, …) over...",
    ),
    "rerun": _Entry(
        "mncloud.cli.runs",
        "Launch a recorded run again: same spec, same options, same commit, same diff.",
    ),
    "doctor": _Entry(
        "mncloud.cli.doctor",
        "Check credentials, bucket and data paths now, instead of at a stuck rendezvous.",
    ),
    "control": _Entry(
        "mncloud.cli.control",
        "Steer a deadline run between spot and on-demand until it ends (started by up).",
        hidden=True,
    ),
    "replay": _Entry(
        "mncloud.cli.replay",
        "Replay a deadline policy on spot traces: cost, hours per market, preemptions;...",
    ),
    "export": _Entry(
        "mncloud.cli.export",
        "Export a complete, verified checkpoint's model as safetensors or one torch file.",
    ),
    "ui": _Entry(
        "mncloud.cli.ui",
        "Serve a web view of the runs on this machine: a runs table, and per run a...",
    ),
    "runs": _Entry("mncloud.cli.runs", "Run records: lineage, events and cost."),
    "ckpt": _Entry("mncloud.cli.ckpt", "List, verify, pull and remove checkpoints.", group=True),
    "chaos": _Entry("mncloud.cli.chaos", "Preempt nodes or cut storage (local runs).", group=True),
}


def _build(name: str, entry: _Entry) -> Any:
    """The click command `name`, built alone: a Typer app with just it, set like the root
    (plain help, help panels), as the root would have built it."""
    module = importlib.import_module(entry.module)
    alone = typer.Typer(rich_markup_mode=None, add_completion=False)
    alone.callback()(_nothing)  # a group, however many commands: the command is one of its own
    if entry.group:
        alone.add_typer(module.app, name=name, help=entry.summary)
    else:
        module.register(alone)
    alone.registered_commands = [c for c in alone.registered_commands if c.name == name]
    alone.registered_groups = [g for g in alone.registered_groups if g.name == name]
    use_panels(alone)
    return typer.main.get_command(alone).commands[name]  # type: ignore[attr-defined]


def _nothing() -> None:
    """(the callback that makes a one-command app a group)"""


class _Commands(MutableMapping[str, Any]):
    """The root's commands by name, `COMMANDS` first: each built on its first lookup. Within
    `stand_ins()` a command not built yet is answered by a stand-in that has only its name, help
    line and hidden flag: enough to list it in help or offer it to shell completion."""

    def __init__(self, table: dict[str, _Entry], given: MutableMapping[str, Any]) -> None:
        self._table = table
        self._built = dict(given)
        self._standing_in = False

    @contextmanager
    def stand_ins(self) -> Iterator[None]:
        self._standing_in = True
        try:
            yield
        finally:
            self._standing_in = False

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            entry = self._table[name]  # KeyError (→ `get` gives None): no such command
            if self._standing_in:
                return TyperCommand(name, help=entry.summary, hidden=entry.hidden)
            self._built[name] = _build(name, entry)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("the root's commands are fixed")

    def __contains__(self, name: object) -> bool:
        return name in self._table or name in self._built

    def __iter__(self) -> Iterator[str]:
        yield from self._table
        yield from (name for name in self._built if name not in self._table)

    def __len__(self) -> int:
        return len(self._table.keys() | self._built.keys())


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
    """The root group: its commands from `COMMANDS`, each built when first looked up (its help
    listing and shell completion read the table); errors become one line on stderr and an exit
    code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(COMMANDS, self.commands)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names only (Typer's own walks the commands, built)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        with self.commands.stand_ins():
            super().format_commands(ctx, formatter)

    def shell_complete(self, ctx: Any, incomplete: str) -> Any:
        with self.commands.stand_ins():
            return super().shell_complete(ctx, incomplete)

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
    from mncloud.cli._common import one_line  # rich's console: not loaded for help

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


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`mncloud`): exits with the command's code."""
    app(args=argv, prog_name="mncloud")
