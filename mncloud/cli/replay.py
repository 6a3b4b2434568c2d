"""`mncloud replay`: a deadline policy over a recorded spot trace, window by window."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json
from mncloud.cli.options import parse_duration
from mncloud.cli.params import DEADLINE_PANEL, ESSENTIALS
from mncloud.errors import SpecError
from mncloud.spec import MAX_NODES

if TYPE_CHECKING:
    from mncloud.replay import Result


def register(app: typer.Typer) -> None:
    """Add `replay` to the app."""
    app.command("replay")(replay_command)


def _seconds(text: str, flag: str) -> float:
    value = parse_duration(text, flag)
    assert value is not None
    return value


@handle_errors
def replay_command(
    trace: Annotated[
        Path,
        typer.Argument(help="Spot trace JSON (../shared/traces/README.md).", show_default=False),
    ],
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", rich_help_panel=ESSENTIALS, min=1, max=MAX_NODES, help="Number of nodes."
        ),
    ] = 1,
    hours: Annotated[
        float,
        typer.Option(
            "--hours",
            rich_help_panel=ESSENTIALS,
            help="Hours of work the job needs without interruptions.",
        ),
    ] = 12.0,
    deadline: opts.Deadline = "24h",
    restart_overhead: Annotated[
        str,
        typer.Option(
            "--restart-overhead",
            rich_help_panel=DEADLINE_PANEL,
            help="Billed time without progress per launch.",
        ),
    ] = "10m",
    spot_price: Annotated[
        float,
        typer.Option("--spot-price", rich_help_panel=DEADLINE_PANEL, help="Spot $ per node-hour."),
    ] = 0.918,
    on_demand_price: Annotated[
        float,
        typer.Option(
            "--on-demand-price", rich_help_panel=DEADLINE_PANEL, help="On-demand $ per node-hour."
        ),
    ] = 3.06,
    start: Annotated[
        str,
        typer.Option(
            "--start", rich_help_panel=ESSENTIALS, help="Start this long into the trace (e.g. 48h)."
        ),
    ] = "0h",
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            rich_help_panel=ESSENTIALS,
            help="Replay a window starting every H (e.g. 24h).",
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            rich_help_panel=DEADLINE_PANEL,
            help="on-demand, greedy, uniform-progress or adaptive (default).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", rich_help_panel=ESSENTIALS, help="Print the result(s) as JSON."),
    ] = False,
) -> None:
    """Replay a deadline policy on a spot trace: cost, hours per market, preemptions."""
    from mncloud.policy import DEFAULT_POLICY, POLICIES, Job, make_policy
    from mncloud.replay import load_trace, replay, window_starts

    name = policy or DEFAULT_POLICY
    if name not in POLICIES:
        raise SpecError(f"--policy {name!r}: choose one of {', '.join(POLICIES)}")
    opts.launch_options_from({"hours": hours})  # the same check as up's and plan's
    opts.deadline_options({"spot_price": spot_price, "on_demand_price": on_demand_price})
    deadline_s = opts.deadline_seconds(deadline or "")  # "": refused as no duration
    assert deadline_s is not None
    overhead_s = _seconds(restart_overhead, "--restart-overhead")
    start_s = _seconds(start, "--start")
    every_s = parse_duration(every, "--every")
    loaded = load_trace(trace)
    job = Job.build(
        nodes=nodes,
        hours=hours,
        deadline_s=deadline_s,
        overhead_s=overhead_s,
        gap_s=loaded.gap,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
    )
    available = loaded.available(nodes)
    starts = window_starts(loaded, job, every_s, start_s)
    results = [replay(make_policy(name, job), available, s) for s in starts]
    if as_json:
        print_json([r.to_json() for r in results] if every is not None else results[0].to_json())
    else:
        show(results, name, nodes)


def show(results: list[Result], name: str, nodes: int) -> None:
    """A table (one row per window, ≤ 80 columns) and one summary line."""
    from rich.table import Table

    table = Table(title=f"policy {name}, {nodes} node(s)", title_justify="left")
    for header in ("start h", "cost $", "vs od", "met", "done h", "spot h", "od h", "idle h"):
        table.add_column(header, justify="right")
    table.add_column("sw", justify="right")
    table.add_column("pre", justify="right")
    for r in results:
        table.add_row(
            f"{r.start_hours:g}",
            f"{r.cost:,.2f}",
            f"{r.cost / r.on_demand_cost:.2f}",
            "yes" if r.met_deadline else "NO",
            "-" if r.finished_hours is None else f"{r.finished_hours:.2f}",
            f"{r.spot_hours:.2f}",
            f"{r.on_demand_hours:.2f}",
            f"{r.idle_hours:.2f}",
            str(r.switches),
            str(r.preemptions),
        )
    console.print(table)
    cost = sum(r.cost for r in results)
    od = sum(r.on_demand_cost for r in results)
    missed = sum(not r.met_deadline for r in results)
    console.print(
        f"{len(results)} window(s): ${cost:,.2f} against ${od:,.2f} all on-demand "
        f"({cost / od:.0%}); deadlines missed: {missed}",
        highlight=False,
    )
