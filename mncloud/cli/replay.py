"""`mncloud replay`: a deadline policy over recorded spot traces, window by window.

One trace: one place (`mncloud.deadline.replay`). Several: several places over the same clock, each
trace a place named after its file, priced per place (`mncloud.deadline.replay_places`), with the
offline optimum across places beside each window.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json
from mncloud.cli.options import parse_duration
from mncloud.cli.params import DEADLINE_PANEL, ESSENTIALS
from mncloud.constants import LOCAL_ON_DEMAND_PRICE, LOCAL_SPOT_PRICE
from mncloud.errors import SpecError
from mncloud.options import DEFAULT_RECOVERY_MINUTES, MAX_NODES, job_default

if TYPE_CHECKING:
    from mncloud.deadline.places import PlacesJob
    from mncloud.deadline.policy import Job
    from mncloud.deadline.replay import Result
    from mncloud.deadline.replay_places import PlacesResult
    from mncloud.plan.traces import Trace


def register(app: typer.Typer) -> None:
    """Add `replay` to the app."""
    app.command("replay")(replay_command)


def _seconds(text: str, flag: str) -> float:
    value = parse_duration(text, flag)
    assert value is not None
    return value


@handle_errors
def replay_command(
    traces: Annotated[
        list[Path],
        typer.Argument(
            help="Spot trace JSON (../shared/traces/README.md); several: one place each, over "
            "the same clock (same gap_seconds).",
            show_default=False,
        ),
    ],
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", rich_help_panel=ESSENTIALS, min=1, max=MAX_NODES, help="Number of nodes."
        ),
    ] = job_default("nodes"),
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
    ] = f"{DEFAULT_RECOVERY_MINUTES:g}m",
    spot_price: Annotated[
        list[float] | None,
        typer.Option(
            "--spot-price",
            rich_help_panel=DEADLINE_PANEL,
            help=f"Spot $ per node-hour: once for every trace, or once per trace in their order "
            f"[default: {LOCAL_SPOT_PRICE}].",
            show_default=False,
        ),
    ] = None,
    on_demand_price: Annotated[
        float,
        typer.Option(
            "--on-demand-price", rich_help_panel=DEADLINE_PANEL, help="On-demand $ per node-hour."
        ),
    ] = LOCAL_ON_DEMAND_PRICE,
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
            help="on-demand, greedy, uniform-progress or adaptive (default); with several "
            "traces, the same policy across places.",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", rich_help_panel=ESSENTIALS, help="Print the result(s) as JSON."),
    ] = False,
) -> None:
    """Replay a deadline policy on spot traces: cost, hours per market, preemptions; with
    several traces, across places (one per trace), beside the optimum across them."""
    from mncloud.deadline.policy import DEFAULT_POLICY, POLICIES, Job, make_policy
    from mncloud.deadline.replay import replay, window_starts
    from mncloud.plan.traces import load_trace

    name = policy or DEFAULT_POLICY
    if name not in POLICIES:
        raise SpecError(f"--policy {name!r}: choose one of {', '.join(POLICIES)}")
    opts.launch_options_from({"hours": hours})  # the same check as up's and plan's
    prices = per_trace(spot_price or [LOCAL_SPOT_PRICE], len(traces), "--spot-price")
    for price in prices:
        opts.deadline_options({"spot_price": price, "on_demand_price": on_demand_price})
    deadline_s = opts.deadline_seconds(deadline or "")  # "": refused as no duration
    assert deadline_s is not None
    overhead_s = _seconds(restart_overhead, "--restart-overhead")
    start_s = _seconds(start, "--start")
    every_s = parse_duration(every, "--every")
    loaded = [load_trace(t) for t in traces]
    names = place_names(traces)
    gap, common = _common_span(loaded, names)
    job = Job.build(
        nodes=nodes,
        hours=hours,
        deadline_s=deadline_s,
        overhead_s=overhead_s,
        gap_s=gap,
        spot_price=min(prices),
        on_demand_price=on_demand_price,
    )
    starts = window_starts(loaded[0], job, every_s, start_s, length=common)
    if len(loaded) > 1:
        _across_places(loaded, names, prices, job, starts, name, common, every is not None, as_json)
        return
    available = loaded[0].available(nodes)
    results = [replay(make_policy(name, job), available, s) for s in starts]
    if as_json:
        print_json([r.to_json() for r in results] if every is not None else results[0].to_json())
    else:
        show(results, name, nodes)


def per_trace(values: list[float], count: int, flag: str) -> list[float]:
    """One value per trace from an option given once (for all) or once per trace."""
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise SpecError(
            f"{flag} given {len(values)} times for {count} trace(s): give it once for all, "
            f"or once per trace in their order"
        )
    return values


def place_names(paths: list[Path]) -> list[str]:
    """A place per trace, named after its file (`us-east-1a_v100_1`); a repeated name gets
    `-2`, `-3`, … in the order given."""
    names: list[str] = []
    for path in paths:
        name, n = path.stem, 1
        while name in names:
            n += 1
            name = f"{path.stem}-{n}"
        names.append(name)
    return names


def _common_span(loaded: list[Trace], names: list[str]) -> tuple[int, int | None]:
    """The traces' gap and, when their lengths differ, the common length (else None)."""
    if len(loaded) == 1:
        return loaded[0].gap, None
    from mncloud.deadline.replay_places import align

    return align(loaded, names)


def _across_places(
    loaded: list[Trace],
    names: list[str],
    prices: list[float],
    job: Job,
    starts: list[int],
    name: str,
    common: int | None,
    every: bool,
    as_json: bool,
) -> None:
    """Replay the multi-place policy `name` and the optimum across places; print them."""
    from mncloud.deadline.places import Place, PlacesJob, make_places_policy
    from mncloud.deadline.replay_places import availability, optimum_places, replay_places

    pjob = PlacesJob(job, tuple(Place(n, p) for n, p in zip(names, prices, strict=True)))
    available = availability(loaded, job.nodes, common)
    results = [replay_places(make_places_policy(name, pjob), available, s) for s in starts]
    optima = [float(c) for c in optimum_places(pjob, available, starts)]
    if common is not None:
        print(
            f"note: the traces differ in length; replaying their common span, the first "
            f"{job.hours(common):,.2f} h ({common:,} ticks)",
            file=sys.stderr,
            flush=True,
        )
    if as_json:
        rows = [
            {**r.to_json(), "places": names, "optimum_cost": round(o, 4)}
            for r, o in zip(results, optima, strict=True)
        ]
        print_json(rows if every else rows[0])
    else:
        show_places(results, optima, pjob, name)


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


def show_places(
    results: list[PlacesResult], optima: list[float], pjob: PlacesJob, name: str
) -> None:
    """Per window (≤ 80 columns): cost beside the optimum across places; per place: spot hours
    and $ over all windows; one summary line."""
    from rich.table import Table

    k, nodes = pjob.k, pjob.job.nodes
    title = f"policy {name} across {k} places, {nodes} node(s)"
    table = Table(title=title, title_justify="left")
    heads = ("start h", "cost $", "opt $", "×opt", "met", "done h", "spot h", "od h", "mv", "pre")
    for header in heads:
        table.add_column(header, justify="right")
    for r, opt in zip(results, optima, strict=True):
        table.add_row(
            f"{round(r.start_hours, 1):g}",
            f"{r.cost:,.2f}",
            f"{opt:,.2f}",
            _ratio(r.cost, opt),
            "yes" if r.met_deadline else "NO",
            "-" if r.finished_hours is None else f"{r.finished_hours:.2f}",
            f"{r.spot_hours:.2f}",
            f"{r.on_demand_hours:.2f}",
            str(r.moves),
            str(r.preemptions),
        )
    console.print(table)
    places = Table(title="spot per place, all windows", title_justify="left")
    for header in ("place", "$/node-h", "spot h", "spot $"):
        places.add_column(header, justify="left" if header == "place" else "right")
    for p, place in enumerate(pjob.places):
        places.add_row(
            place.name,
            f"{place.spot_price:g}",
            f"{sum((r.spot_hours_by_place or [])[p] for r in results):,.2f}",
            f"{sum((r.spot_cost_by_place or [])[p] for r in results):,.2f}",
        )
    console.print(places)
    cost, best = sum(r.cost for r in results), sum(optima)
    od = sum(r.on_demand_cost for r in results)
    missed = sum(not r.met_deadline for r in results)
    console.print(
        f"{len(results)} window(s): ${cost:,.2f}, {_ratio(cost, best)}× the optimum across "
        f"places (${best:,.2f})\n{cost / od:.0%} of all on-demand (${od:,.2f}); moves: "
        f"{sum(r.moves for r in results)}; deadlines missed: {missed}",
        highlight=False,
    )


def _ratio(cost: float, best: float) -> str:
    """cost / best to 3 decimals; "-" against a free optimum (spot at $0)."""
    return f"{cost / best:.3f}" if best > 0 else "-"
