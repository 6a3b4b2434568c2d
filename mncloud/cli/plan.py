"""`mncloud plan`: rank every fitting offer by its expected cost to finish the job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from mncloud.cli import options as opts
from mncloud.cli import plan_rows, plan_tables
from mncloud.cli._common import console, err_console, handle_errors, print_json
from mncloud.cli.params import ESSENTIALS

if TYPE_CHECKING:
    from mncloud.deadline.pricing import DeadlineReport
    from mncloud.options import JobOptions
    from mncloud.plan import Candidate, Plan, PlanRequest


def register(app: typer.Typer) -> None:
    """Add `plan` to the app."""
    app.command("plan")(plan_command)


@opts.command(opts.MARKET, opts.PLANNING)
@handle_errors
def plan_command(
    script: Annotated[
        Path | None,
        typer.Argument(
            help="The training script, optional: with it the plan is the one `up` would make "
            "with the same options (its mncloud.yaml, its --recovery default); without it, "
            "gang recovery is assumed unless --recovery says otherwise.",
            show_default=False,
        ),
    ] = None,
    script_args: opts.ScriptArgs = None,
    recovery: opts.Recovery = None,
    bucket: opts.Bucket = None,
    deadline: opts.Deadline = None,
    budget: opts.PlanBudget = None,
    min_nodes: opts.MinNodes = None,
    top: Annotated[
        int | None,
        typer.Option(
            "--top",
            min=1,
            rich_help_panel=ESSENTIALS,
            help="Show only the N cheapest offers (a row is one offer; regions at the same price "
            "share its row).",
        ),
    ] = None,
    as_json: opts.Json = False,
    parallel: opts.PlanParallel = None,
    network: opts.Network = None,
    wide: opts.Wide = False,
    profile: opts.ProfileFirst = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            rich_help_panel=ESSENTIALS,
            help="Also show excluded clouds and the model inputs.",
        ),
    ] = False,
    **values: Any,
) -> None:
    """Rank clouds, regions and instance types by expected cost to finish, preemptions included."""
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(values["catalog"])  # before anything imports sky
    from mncloud.plan import make_plan

    deadline_s = _deadline_seconds(deadline, budget)
    values["script_args"] = list(script_args or [])
    values["bucket"] = bucket
    if _runs_locally(values, script, recovery, as_json):
        return
    if script is not None and (profile or _offer_to_profile(script, values)):
        _profile_first(script, values["script_args"])
    request = _with_plan_flags(_request(values, script, recovery), parallel, network)
    if deadline_s is not None:
        from mncloud.deadline.pricing import deadline_job, elastic_ride

        job = deadline_job(  # a deadline too short fails here, before the catalog is read
            nodes=request.nodes,
            hours=request.hours,
            deadline_s=deadline_s,
            recovery_minutes=request.recovery_minutes,
        )
        if min_nodes is not None:
            elastic_ride(job, min_nodes)  # so does a bad --min-nodes
    elif min_nodes is not None:
        raise opts.SpecError("--min-nodes prices an elastic spot run by a deadline: add --deadline")
    plan = make_plan(request)
    report = None
    if deadline_s is not None:
        from mncloud.deadline.pricing import estimate_deadline

        report = estimate_deadline(plan, deadline_s, budget=budget, min_nodes=min_nodes)
    assumed = assumed_recovery(request, script, recovery)
    if as_json:
        print_json(plan_rows.json(plan, report, top) | {"recovery_assumed": assumed})
        return
    show_plan(plan, top=top, verbose=verbose, wide=wide)
    if assumed:
        console.print(assumed, style="dim", highlight=False)
    if values["learn"] and not request.learned:
        console.print(NOTHING_LEARNED, style="dim", highlight=False)
    if not values["cloud"] and _no_cloud_enabled():
        console.print(NO_CLOUD_PRICES, style="dim", highlight=False)
    if report is not None:
        show_deadline(report, top=top)


NO_CLOUD_PRICES = (
    "no cloud is enabled in SkyPilot yet (`sky check` found none): these are the catalog's "
    "prices; `up` needs one enabled to run there"
)


def assumed_recovery(request: PlanRequest, script: Path | None, recovery: str | None) -> str | None:
    """What `plan` without a script says of the recovery mode it priced (2+ nodes, no
    --recovery): `up SCRIPT` may take node recovery, so the plan names its assumption."""
    if script is not None or recovery is not None or request.nodes < 2:
        return None
    return (
        f"recovery: {request.recovery.value}, assumed (no script given). `up` takes node "
        "recovery for a script that uses mncloud.train.Replicas, on 2+ nodes with a bucket; "
        "`mncloud plan SCRIPT --bucket URL` plans what `up SCRIPT` launches"
    )


def _no_cloud_enabled() -> bool:
    from mncloud.catalog.clouds import enabled_clouds

    return enabled_clouds() == []


def _runs_locally(
    values: dict[str, Any], script: Path | None, recovery: str | None, as_json: bool
) -> bool:
    """No cloud named, no GPU asked for and none enabled: `up` would run on this machine, so
    there is nothing to plan; say so (the notice on stderr) and return True."""
    from mncloud.request import local_when_no_cloud, spec_from

    notices: list[str] = []
    if script is not None:
        market = _market(values, recovery)
        spec = spec_from(script, values["script_args"], market, on_local=notices.append)
        gpus = str(spec.accelerator)
    else:
        options, notice = local_when_no_cloud(_market(values, recovery))
        notices += filter(None, [notice])
        gpus = str(options.gpus)
        if notices:  # the checks a plan would make of the same options
            _check_market(values)
    if not notices:
        return False
    err_console.print(f"notice: {notices[0]}", highlight=False, soft_wrap=True)
    if as_json:
        print_json({"backend": "local", "gpus": gpus, "candidates": []})
    else:
        console.print(
            f"nothing to plan: `up` runs it on this machine ({gpus}) at no cloud cost; give "
            "--gpus NAME (e.g. H100:8) to see what a cloud would cost",
            highlight=False,
        )
    return True


def _market(values: dict[str, Any], recovery: str | None) -> JobOptions:
    """The job options `plan` takes (the market, `--recovery` and `--bucket`, on which the
    recovery default depends); the rest is a script's."""
    from mncloud.options import JobOptions

    return JobOptions(
        gpus=values["gpus"],
        nodes=values["nodes"],
        spot=values["spot"],
        cloud=values["cloud"],
        region=values["region"],
        max_hourly=values["max_hourly"],
        recovery=recovery,
        bucket=values.get("bucket"),
    )


def _check_market(values: dict[str, Any]) -> None:
    from mncloud.request import checked_nodes
    from mncloud.spec import MAX_USD

    checked_nodes(1 if values["nodes"] is None else values["nodes"])
    hourly = values["max_hourly"]
    if hourly is not None and not 0 < hourly <= MAX_USD:
        raise opts.SpecError(f"--max-hourly {hourly!r}: give USD per hour above 0")
    opts.launch_options_from(values)


def _request(values: dict[str, Any], script: Path | None, recovery: str | None) -> PlanRequest:
    """The plan request from the command's market and planning options; with a script, the
    request `up` would plan (its mncloud.yaml, its --recovery default)."""
    from mncloud.launch import model_inputs, plan_request
    from mncloud.plan import PlanRequest
    from mncloud.spec import Accelerator, Recovery, SpotPolicy, default_of

    if script is not None:
        from mncloud.request import spec_from

        spec = spec_from(script, values["script_args"], _market(values, recovery))
        return plan_request(spec, opts.launch_options_from(values))
    if not values["gpus"]:
        raise opts.SpecError("--gpus is required, e.g. --gpus H100:8")
    accelerator, *alternatives = Accelerator.parse_list(values["gpus"])
    options = opts.launch_options_from(values)
    return PlanRequest.for_market(
        accelerator,
        alternatives,
        nodes=default_of("nodes") if values["nodes"] is None else values["nodes"],
        spot=SpotPolicy.from_flag(values["spot"]),
        clouds=list(values["cloud"] or []),
        regions=list(values["region"] or []),
        max_hourly=values["max_hourly"],
        recovery=Recovery.read(recovery or Recovery.GANG, "--recovery"),
        network=default_of("network"),
        options=options,
        inputs=model_inputs(options),
    )


def _with_plan_flags(
    request: PlanRequest, parallel: str | None, network: str | None
) -> PlanRequest:
    """The request with `--parallel` and `--network` (plan's own flags), checked."""
    from mncloud.spec import NetworkTier, Parallel

    update: dict[str, Any] = {}
    if parallel is not None and parallel != "auto":
        try:
            update["parallel"] = Parallel(parallel)
        except ValueError:
            raise opts.SpecError(f"--parallel {parallel!r}: give auto, ddp, fsdp or hsdp") from None
    if network is not None:
        try:
            update["network"] = NetworkTier(network)
        except ValueError:
            raise opts.SpecError(f"--network {network!r}: give best or standard") from None
    return request.model_copy(update=update) if update else request


def _offer_to_profile(script: Path, values: dict[str, Any]) -> bool:
    """`plan SCRIPT --steps N` with no fresh profile, at a terminal: ask to profile it now (a
    pipe or a script gets the one-line error naming --profile instead)."""
    import sys

    from mncloud.plan import profile as profiles

    described = ("params", "flops_per_step", "tokens_per_step", "grad_bytes")
    if values["steps"] is None or any(values.get(k) is not None for k in described):
        return False
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return False
    found, freshness = profiles.find(script, values["script_args"])
    if found is not None and freshness is profiles.Freshness.FRESH:
        return False
    return typer.confirm(
        f"{script.name} has no fresh profile for these arguments: profile it here now?",
        default=True,
    )


def _profile_first(script: Path, args: list[str]) -> None:
    """`plan SCRIPT --profile`: profile the script here unless a fresh profile exists."""
    from mncloud.plan import profile as profiles

    found, freshness = profiles.find(script, args)
    if found is not None and freshness is profiles.Freshness.FRESH:
        return
    err_console.print(f"profiling {script.name} here (a few steps)…", highlight=False)
    profiles.save(profiles.run_profile(script, args))


def _deadline_seconds(deadline: str | None, budget: float | None) -> float | None:
    """`--deadline` in seconds (None without it); --budget alone is refused."""
    if deadline is None and budget is not None:
        raise opts.SpecError("--budget needs --deadline (without one, use --max-cost)")
    seconds = opts.deadline_seconds(deadline)
    opts.deadline_options({"budget": budget})
    return seconds


#: From this terminal width on, the plan table shows every column without --wide.
WIDE_COLUMNS = 120
NOTHING_LEARNED = "--learn: no spot node-hours in this machine's run records yet; priors used"


def show_plan(
    plan: Plan, *, top: int | None = None, verbose: bool = False, wide: bool = False
) -> None:
    """Print the ranked offers as a table that fits 80 columns, then why the choice won.

    Each row stacks where (cloud, region) over what (instance type, market); offers that differ
    only in region, at the same price, share one row ("lambda us-east-1 +16 regions").
    """
    request = plan.request
    groups = plan_rows.same_offer_groups(plan.candidates)
    shown = groups[:top] if top else groups
    rows = [c for group in shown for c in group]
    title = f"{request.nodes} × {request.gpus_text}, {request.work}"
    if request.recovery.value == "node":
        title += ", node recovery"
    title += ": cheapest first"
    timed = any(c.step_seconds is not None for c in rows)
    wide = wide or console.width >= WIDE_COLUMNS  # like gh: every column where they fit
    table = plan_tables.offers_table(
        plan, shown, title, timed=timed, wide=wide, width=console.width
    )
    console.print(table)
    note = plan_rows.top_note(len(groups), top) if top else None
    if note:
        console.print(note, style="dim", highlight=False)
    console.print(plan.explanation, highlight=False)
    if request.workload_source and not timed:
        console.print(f"step time: {request.workload_source}", style="dim", highlight=False)
    if verbose:
        _show_details(plan)
        if timed:
            plan_tables.show_steps(console, plan, rows)
        show_recovery(plan, rows)


def show_recovery(plan: Plan, rows: list[Candidate]) -> None:
    """Gang beside node recovery for each shown offer (and the other mode's choice), 2+ nodes.

    An offer a mode would leave out (it would lose over half its time recovering) is starred.
    """
    from mncloud.plan import recovery_note
    from mncloud.plan.costmodel import MAX_LOSS_FRACTION
    from mncloud.spec import Recovery

    request = plan.request
    if request.nodes < 2:
        return
    shown = list(rows)
    if plan.other_choice is not None and plan.other_choice not in shown:
        shown.append(plan.other_choice)
    table = Table(
        title=f"Gang or node recovery (this plan: {request.recovery.value})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("offer", no_wrap=True)
    for header in ("gang\nhours", "gang\ncost $", "node\nhours", "node\ncost $", "node\nrelaunch"):
        table.add_column(header, justify="right", no_wrap=True)
    starred = False
    for group in plan_rows.same_offer_groups(shown):
        c, cells = group[0], []
        for mode in (Recovery.GANG, Recovery.NODE):
            est = c.by_recovery[mode]
            mark = "" if est.viable else "*"
            starred |= not est.viable
            cells += [f"{est.hours:,.1f}", f"{est.cost:,.0f}{mark}"]
        where = f"{c.cloud}/{c.region}" + (f" +{len(group) - 1} regions" if len(group) > 1 else "")
        table.add_row(
            f"{where}\n{c.instance_type} {c.market}",
            *cells,
            f"{c.by_recovery[Recovery.NODE].relaunches:.2f}",
            style="bold green" if plan.choice in group else None,
        )
    console.print(table)
    if starred:
        console.print(
            f"* would lose over {MAX_LOSS_FRACTION:.0%} of its time recovering: left out "
            "under that mode",
            style="dim",
            highlight=False,
        )
    if request.recovery is Recovery.GANG:  # under node recovery the explanation says it
        console.print(recovery_note(plan), highlight=False)


def show_deadline(report: DeadlineReport, *, top: int | None = None) -> None:
    """The deadline figures per place, cheapest under the policy first, in the plan's style.

    Each row stacks where over what (and where its on-demand hours run when not there); places
    whose figures are the same except for the region share one row.
    """
    title = (
        f"By a {report.deadline_hours:g} h deadline, {report.policy} policy: "
        "cheapest expected cost first"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("offer", no_wrap=True)
    for header in ("policy\nexp. $", "all\non-demand\n$", "spot\nonly $\nin time"):
        table.add_column(header, justify="right", no_wrap=True)
    for header in ("hours\nspot\nod", "done\nby h"):
        table.add_column(header, justify="right", no_wrap=True)
    groups = plan_rows.same_place_groups(report.places)
    for group in groups[:top] if top else groups:
        p = group[0]
        where = f"{p.cloud} {p.region}" + (f" +{len(group) - 1} regions" if len(group) > 1 else "")
        market = "on-demand" if p.spot_per_node is None else "spot"
        offer = f"{where}\n{p.instance_type} {market}"
        if p.on_demand_where != "here":
            offer += f"\n+ on-demand {p.on_demand_where}"
        spot_only = (
            "-" if p.spot_only_cost is None else f"{p.spot_only_cost:,.2f}\n{p.spot_only_met:.0%}"
        )
        table.add_row(
            offer,
            f"{p.expected_cost:,.2f}",
            f"{p.on_demand_cost:,.2f}",
            spot_only,
            f"{p.spot_hours:.1f}\n{p.on_demand_hours:.1f}",
            f"{p.finish_hours:.1f}",
            style="bold green" if report.choice in group else None,
        )
    console.print(table)
    console.print(
        f"slack {report.slack_hours:.2f} h: the deadline less {report.hours:g} h of work and one "
        f"{report.recovery_minutes:g} min restart. Means over {report.windows} spot windows drawn "
        f"with each place's hazard (gaps of {report.mean_gap_hours:g} h on average, from the "
        "traces); `mncloud replay` replays a real trace.",
        highlight=False,
        style="dim",
    )
    if report.elastic is not None:
        console.print(report.elastic.line(), highlight=False, style="dim")
    warning = report.over_budget()
    if warning:
        console.print(f"warning: {warning}", style="yellow", highlight=False)


def _show_details(plan: Plan) -> None:
    from mncloud.plan import costmodel

    request = plan.request
    console.print(
        f"model: on-demand faults {costmodel.ON_DEMAND_HAZARD_PER_HOUR:g}/node-h; "
        f"recovery {request.recovery_minutes:g} min; checkpoint {request.ckpt_seconds:g} s"
        + (f"; heal {request.heal_minutes:g} min" if request.nodes > 1 else ""),
        highlight=False,
        style="dim",
    )
    show_hazards(plan)
    show_learned(plan)
    fallbacks = ", ".join(f"{c.cloud}/{c.region}" for c in plan.fallbacks) or "none"
    console.print(f"fallbacks, in order: {fallbacks}", highlight=False)
    for e in plan.excluded:
        console.print(f"excluded {e.cloud}: {e.reason}", highlight=False)


def show_hazards(plan: Plan) -> None:
    """Where each spot hazard came from: one line per (hazard, source), naming the regions."""
    request = plan.request
    if request.preemption_rate is not None:
        console.print(
            f"spot hazard {request.preemption_rate:g}/node-h everywhere: --preemption-rate",
            highlight=False,
        )
        return
    places: dict[tuple[str, float, str], list[str]] = {}
    for c in plan.candidates:
        if c.spot:
            key = (c.cloud, round(c.preemption_rate, 3), c.hazard_source)
            places.setdefault(key, [])
            if c.region not in places[key]:
                places[key].append(c.region)
    for (cloud, hazard, source), regions in places.items():
        shown = ", ".join(regions[:3]) + (f" +{len(regions) - 3}" if len(regions) > 3 else "")
        console.print(
            f"spot hazard {cloud} {shown}: {hazard:.3g}/node-h ({source})", highlight=False
        )
    for item in request.traces:
        console.print(
            f"your trace {item.source}: {item.cloud} {item.region}, {item.preemptions} "
            f"preemptions in {item.node_hours:,.1f} node-h ({item.hazard:.3g}/node-h)",
            highlight=False,
        )


def show_learned(plan: Plan) -> None:
    """One line per cloud whose spot hazard `--learn` took from the run records."""
    request = plan.request
    for item in request.learned:
        console.print(
            f"learned {item.cloud}: {item.preemptions} preemptions in {item.node_hours:,.1f} spot "
            f"node-h ({item.observed:.3g}/node-h), blended with the prior {item.prior:.3g} at "
            f"{item.weight:.0%} weight → {item.hazard:.3g}/node-h"
            + (", overridden by --preemption-rate" if request.preemption_rate is not None else ""),
            highlight=False,
        )
