"""`mncloud status`, `logs`, `down`: operate runs whichever backend they run on."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from mncloud.cli._common import console, handle_errors, print_json


def register(app: typer.Typer) -> None:
    """Add `status`, `logs` and `down` to the app."""
    app.command("status")(status_command)
    app.command("logs")(logs_command)
    app.command("down")(down_command)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@handle_errors
def status_command(
    name: Annotated[str | None, typer.Argument(help="A run name; all runs when omitted.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show runs: state, where, nodes, restarts, newest checkpoint, cost so far, stragglers."""
    from mncloud.backends.registry import known_runs
    from mncloud.operate import run_status

    names = [name] if name else known_runs()
    statuses = [run_status(n) for n in names]
    if as_json:
        print_json([s.model_dump(mode="json") for s in statuses])
        return
    if not statuses:
        console.print("No runs yet. Start one: mncloud up train.py --cloud local --gpus cpu:2")
        return
    table = Table(title="mncloud runs", title_justify="left")
    # "started": how long ago the run began; "ran": how long it has run (to its end, if over).
    for column in ("name", "state", "where", "restarts", "ckpt", "started", "ran", "cost"):
        table.add_column(column, no_wrap=column != "where")
    now = time.time()
    for s in statuses:
        where = "/".join(p for p in (s.cloud, s.region, s.instance_type) if p) or s.backend
        where = f"{s.nodes}× {where}" + (" spot" if s.spot else "")
        cost = f"${s.cost_so_far:,.2f}" if s.cost_so_far is not None else "-"
        ran = None if s.started_at is None else (s.ended_at or now) - s.started_at
        ago = None if s.started_at is None else now - s.started_at
        table.add_row(
            s.name,
            s.state.value,
            where,
            f"{s.restarts} ({s.preemptions} preempted)",
            "-" if s.ckpt_step is None else str(s.ckpt_step),
            "-" if ago is None else f"{_duration(ago)} ago",
            _duration(ran),
            cost,
        )
    console.print(table)
    # The free-text detail goes below the table, one line a run, where it has the full width.
    for s in statuses:
        if s.detail:
            style = "yellow" if s.stragglers else "dim"
            console.print(Text(f"{s.name}: ", style="bold") + Text(s.detail, style=style))


@handle_errors
def logs_command(
    name: Annotated[str, typer.Argument(help="The run name.")],
    node: Annotated[int | None, typer.Option("--node", help="Only this node's lines.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
) -> None:
    """Print the run's output from all nodes, each line prefixed with node and rank."""
    from mncloud.backends.registry import backend_for_run

    try:
        for line in backend_for_run(name).logs(name, node=node, follow=follow):
            typer.echo(line)
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None


@handle_errors
def down_command(
    name: Annotated[str, typer.Argument(help="The run name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Stop the run and release its nodes (checkpoints stay in the bucket)."""
    from mncloud.backends.registry import backend_for_run

    status = backend_for_run(name).down(name)
    if as_json:
        print_json(status.model_dump(mode="json"))
    else:
        console.print(f"[bold]{status.name}[/]: {status.state.value} {status.detail}")
