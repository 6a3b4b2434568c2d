"""`mncloud plan`: rank every fitting offer by its expected cost to finish the job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json

if TYPE_CHECKING:
    from mncloud.plan import Candidate, Plan


def register(app: typer.Typer) -> None:
    """Add `plan` to the app."""
    app.command("plan")(plan_command)


@handle_errors
def plan_command(
    gpus: opts.Gpus = None,
    nodes: opts.Nodes = None,
    hours: opts.Hours = opts.DEFAULT_HOURS,
    spot: opts.Spot = None,
    cloud: opts.Cloud = None,
    region: opts.Region = None,
    max_hourly: opts.MaxHourly = None,
    max_cost: opts.MaxCost = None,
    preemption_rate: opts.PreemptionRate = None,
    learn: opts.Learn = False,
    recovery_minutes: opts.RecoveryMinutes = None,
    ckpt_seconds: opts.CkptSeconds = None,
    top: Annotated[
        int | None, typer.Option("--top", min=1, help="Show only the N cheapest.")
    ] = None,
    as_json: opts.Json = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Also show excluded clouds and the model inputs."),
    ] = False,
    catalog: opts.Catalog = None,
) -> None:
    """Rank clouds, regions and instance types by expected cost to finish, preemptions included."""
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(catalog)  # before anything imports sky
    from mncloud.launch import learned_hazards
    from mncloud.plan import PlanRequest, make_plan
    from mncloud.spec import Accelerator, SpotPolicy

    if not gpus:
        raise opts.SpecError("--gpus is required, e.g. --gpus H100:8")
    policy = {True: SpotPolicy.SPOT, False: SpotPolicy.ON_DEMAND, None: SpotPolicy.EITHER}[spot]
    request = PlanRequest.build(
        accelerator=Accelerator.parse(gpus),
        nodes=1 if nodes is None else nodes,
        spot=policy,
        clouds=list(cloud or []),
        regions=list(region or []),
        hours=hours,
        max_hourly=max_hourly,
        max_cost=max_cost,
        preemption_rate=preemption_rate,
        learned=learned_hazards() if learn else [],
        **{
            k: v
            for k, v in {"recovery_minutes": recovery_minutes, "ckpt_seconds": ckpt_seconds}.items()
            if v is not None
        },
    )
    plan = make_plan(request)
    if as_json:
        print_json(plan.to_json(top=top))
    else:
        show_plan(plan, top=top, verbose=verbose)
        if learn and not request.learned:
            console.print(NOTHING_LEARNED, style="dim", highlight=False)


NOTHING_LEARNED = "--learn: no spot node-hours in this machine's run records yet; priors used"


def show_plan(plan: Plan, *, top: int | None = None, verbose: bool = False) -> None:
    """Print the ranked offers as a table that fits 80 columns, then why the choice won.

    Each row stacks where (cloud, region) over what (instance type, market); offers that differ
    only in region, at the same price, share one row ("lambda us-east-1 +16 regions").
    """
    request = plan.request
    rows = plan.candidates[:top] if top else plan.candidates
    title = f"{request.nodes} × {request.accelerator}, {request.hours:g} h of work: cheapest first"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("offer", no_wrap=True)
    for header in ("$/h\nnode\njob", "exp.\nhours", "exp.\ncost", "exp.\npreempt.", "ckpt\nevery"):
        table.add_column(header, justify="right", no_wrap=True)
    for group in _same_offer_groups(rows):
        c = group[0]
        where = f"{c.cloud} {c.region}" + (f" +{len(group) - 1} regions" if len(group) > 1 else "")
        table.add_row(
            f"{where}\n{c.instance_type} {c.market}",
            f"{c.hourly_per_node:,.2f}\n{c.hourly_total:,.2f}",
            f"{c.expected_hours:,.2f}",
            f"${c.expected_cost:,.2f}",
            f"{c.expected_preemptions:.2f}",
            _duration(c.checkpoint_interval_s),
            style="bold green" if plan.choice in group else None,
        )
    console.print(table)
    if top and len(plan.candidates) > top:
        console.print(f"({len(plan.candidates) - top} more; drop --top to see all)", style="dim")
    console.print(plan.explanation, highlight=False)
    if verbose:
        _show_details(plan)


def _same_offer_groups(rows: list[Candidate]) -> list[list[Candidate]]:
    """Consecutive offers that differ only in region, at the same price, grouped together."""
    groups: list[list[Candidate]] = []
    for c in rows:
        last = groups[-1][0] if groups else None
        same = last is not None and (
            (last.cloud, last.instance_type, last.spot, last.hourly_per_node, last.expected_cost)
            == (c.cloud, c.instance_type, c.spot, c.hourly_per_node, c.expected_cost)
        )
        if same:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _show_details(plan: Plan) -> None:
    from mncloud import plan as plan_mod

    request = plan.request
    if request.preemption_rate is not None:
        hazards = f"{request.preemption_rate:g}/node-h on every cloud"
    else:
        per_cloud = plan_mod.SPOT_HAZARD_PER_HOUR | request.hazards
        hazards = (
            ", ".join(
                f"{k} {v:.3g}" + (" (learned)" if k in request.hazards else "")
                for k, v in per_cloud.items()
            )
            + f", others {plan_mod.DEFAULT_SPOT_HAZARD_PER_HOUR:g} /node-h"
        )
    console.print(
        f"model: spot preemptions {hazards}; on-demand faults "
        f"{plan_mod.ON_DEMAND_HAZARD_PER_HOUR:g}/node-h; "
        f"recovery {request.recovery_minutes:g} min; checkpoint {request.ckpt_seconds:g} s",
        highlight=False,
        style="dim",
    )
    show_learned(plan)
    fallbacks = ", ".join(f"{c.cloud}/{c.region}" for c in plan.fallbacks) or "none"
    console.print(f"fallbacks, in order: {fallbacks}", highlight=False)
    for e in plan.excluded:
        console.print(f"excluded {e.cloud}: {e.reason}", highlight=False)


def show_learned(plan: Plan) -> None:
    """One line per cloud whose spot hazard `--learn` took from the run records."""
    request = plan.request
    for item in request.learned:
        console.print(
            f"learned {item.cloud}: {item.preemptions} preemptions in {item.node_hours:,.1f} spot "
            f"node-h ({item.observed:.3g}/node-h), blended with the prior {item.prior:g} at "
            f"{item.weight:.0%} weight → {item.hazard:.3g}/node-h"
            + (", overridden by --preemption-rate" if request.preemption_rate is not None else ""),
            highlight=False,
        )


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes / 60:.1f} h" if minutes >= 90 else f"{minutes:.0f} min"
