"""`mncloud up`: plan → render → launch (`mncloud.launch`), on a cloud or on this machine."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from mncloud.cli import options as opts
from mncloud.cli._common import console, err_console, handle_errors, print_json
from mncloud.options import MAX_HOURS

if TYPE_CHECKING:
    from mncloud.backends.base import RunStatus
    from mncloud.launch import Existing
    from mncloud.plan import Plan
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import LaunchOptions


def register(app: typer.Typer) -> None:
    """Add `up` to the app."""
    app.command("up")(up_command)


@opts.command(
    opts.SCRIPT,
    opts.MARKET,
    opts.JOB,
    opts.EXISTING,
    opts.PLANNING,
    opts.LAUNCH,
    opts.CLUSTER,
    opts.LOCAL,
    opts.DEADLINE,
)
@handle_errors
def up_command(
    ctx: typer.Context, export_on_finish: opts.ExportOnFinish = None, **values: Any
) -> None:
    """Plan, render and launch SCRIPT on the cheapest fitting cloud (or --cloud local).

    With no --cloud and no cloud enabled in SkyPilot (`sky check`), it runs on this machine.
    With --deadline, a controller steers the run between spot and on-demand to finish in time.
    """
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(values["catalog"])
    from mncloud.launch import Existing

    resume, replace = values["resume"], values["replace"]
    if resume and replace:
        raise opts.SpecError("--resume and --replace exclude each other; pick one")
    existing = Existing.RESUME if resume else Existing.REPLACE if replace else Existing.REFUSE
    values["export_on_finish"] = export_on_finish
    deprecated = opts.retry_alias(values)
    if values["idle_minutes"] is not None and not values["cluster"]:
        raise opts.SpecError(
            "--idle-minutes is the idle timer of a --cluster run; add --cluster (a managed "
            "job's cluster goes when its job ends)"
        )
    if values["cluster"] and values["recovery"] is None:
        values["recovery"] = "gang"  # one cluster, one gang: node recovery needs a job group
    if values["deadline"] is not None or _deadline_only(values):
        _up_deadline({**values, "ctx": ctx}, existing)
    else:
        notices: list[str] = []
        spec = _spec(values, existing, notices)
        if spec.min_nodes is not None:
            raise opts.SpecError(
                "--min-nodes is kept by the run's controller: add --deadline (on a cloud) or "
                "--spot-trace (--cloud local), or drop --min-nodes"
            )
        launch_options = opts.launch_options_from(values)
        opts.print_notices(notices)
        launch_and_follow(
            spec,
            launch_options,
            existing=existing,
            yes=values["yes"],
            detach=values["detach"],
            dryrun=values["dryrun"],
            as_json=values["as_json"],
        )
    opts.print_notices([deprecated] if deprecated else [])  # last: never before a one-line error


def _spec(values: dict[str, Any], existing: Existing, notices: list[str]) -> JobSpec:
    """The JobSpec of `up`'s options, with `--export-on-finish` (an `up`-only option).

    Without a name (flag or mncloud.yaml), a new run gets a new one (`train-3f9a`), and
    `--resume` / `--replace` take the newest run of the script; `notices` gets what to say."""
    spec = opts.spec_from_options(
        values, default_name=_default_name(existing, notices), notices=notices
    )
    if values.get("export_on_finish") is None:
        return spec
    from mncloud.export import ExportFormat

    fmt = ExportFormat.parse(values["export_on_finish"], "--export-on-finish")
    if spec.bucket is None and not spec.is_local:
        raise opts.SpecError(
            "--export-on-finish needs --bucket on a cloud: the export goes to "
            "<bucket>/<name>/export beside the checkpoints"
        )
    return spec.updated(export_on_finish=fmt)


#: `--spot-trace` without `--deadline`: a year, which the policy never comes near.
NO_DEADLINE_S = MAX_HOURS * 3600.0
_DEADLINE_ONLY = (
    "budget", "spot_trace", "time_scale", "pace_steps", "spot_price", "on_demand_price",
)  # fmt: skip


def _deadline_only(values: dict[str, Any]) -> bool:
    return any(values.get(name) not in (None, []) for name in _DEADLINE_ONLY)


def _default_name(existing: Existing, notices: list[str]) -> Callable[[str], str]:
    """The run name `up` takes when none is given: a new unique one, or for `--resume` /
    `--replace` the newest run named after the script (`train-3f9a`, or an older `train`)."""
    from mncloud.launch import Existing
    from mncloud.request import newest_default_run, unique_name

    if existing is Existing.REFUSE:
        return unique_name

    def newest(stem: str) -> str:
        from mncloud.backends.registry import known_runs

        flag = f"--{existing.value}"
        name = newest_default_run(stem, known_runs(), flag)
        notices.append(f"{flag}: {name}, the newest run of this script (--name picks another)")
        return name

    return newest


def _up_deadline(values: dict[str, Any], existing: Existing) -> None:
    """`up --deadline`: start the deadline controller (`mncloud.cli.control`)."""
    from mncloud.cli.control import start_deadline_run

    no_deadline = values["deadline"] is None
    if no_deadline and not values["spot_trace"]:
        raise opts.SpecError(
            "--budget, --spot-trace, --time-scale, --pace-steps and the prices need --deadline"
        )
    if values["cluster"]:
        raise opts.SpecError(
            "--cluster keeps one cluster up for `mncloud exec`; a --deadline run switches "
            "markets by launching anew: drop one of them"
        )
    # A local rehearsal without a deadline (`--spot-trace` alone, e.g. an elastic run's
    # `--min-nodes`): spot only, waiting for capacity; a year is no deadline.
    deadline_s = NO_DEADLINE_S if no_deadline else opts.deadline_seconds(values["deadline"])
    assert deadline_s is not None
    prices = list(values["spot_price"] or [])
    for price in prices:  # each checked as one would be
        opts.deadline_options({"spot_price": price})
    numbers = opts.deadline_options({**values, "spot_price": None})
    source = values["ctx"].get_parameter_source("hours")
    notices: list[str] = []
    spec = _spec(values, existing, notices)
    launch_options = opts.launch_options_from(values)
    opts.print_notices(notices)
    start_deadline_run(
        spec,
        launch_options,
        deadline_s=deadline_s,
        numbers=numbers,
        spot_prices=prices,
        spot_traces=list(values["spot_trace"] or []),
        hours_given=no_deadline or (source is not None and source.name != "DEFAULT"),
        existing=existing.value,
        dryrun=values["dryrun"],
        as_json=values["as_json"],
    )


def launch_and_follow(
    spec: JobSpec,
    launch_options: LaunchOptions,
    *,
    existing: Existing,
    yes: bool,
    detach: bool,
    dryrun: bool,
    as_json: bool,
) -> None:
    """Launch through `mncloud.launch`, show the plan and ask first, then follow the logs."""
    from mncloud.backends.base import RunState
    from mncloud.launch import LaunchCancelled, launch

    def approve(plan: Plan) -> bool:
        return _show_and_confirm(plan, spec.name, yes=yes or dryrun, as_json=as_json)

    try:
        launched = launch(
            spec,
            launch_options,
            dryrun=dryrun,
            existing=existing,
            approve=approve,
            notify=_notify,
        )
    except LaunchCancelled:
        raise typer.Exit(code=1) from None
    status = launched.status
    if dryrun and not as_json:  # what would be launched, as `mncloud render --plan` prints it
        typer.echo(launched.prepared.task.yaml_text, nl=False)
    if not detach and not as_json and not dryrun:
        status = follow(launched.prepared.backend, spec.name)
    if as_json:
        print_json(status.model_dump(mode="json"))
    else:
        console.print(
            f"[bold]{status.name}[/]: {escape(status.detail or status.state.value.lower())}",
            soft_wrap=True,
        )
    if status.state is RunState.FAILED:
        raise typer.Exit(code=1)


def _notify(text: str) -> None:
    if text.startswith("warning: "):
        warning = escape(text.removeprefix("warning: "))
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    else:
        console.print(text, highlight=False, soft_wrap=True)


def follow(backend_name: str, name: str) -> RunStatus:
    """Follow a run until it ends: the local live view, or SkyPilot's log stream."""
    from mncloud.backends.registry import get_backend

    backend = get_backend(backend_name)
    if backend.runs_here:
        from mncloud.cli.follow import follow_local_run

        return follow_local_run(backend, name)
    for line in backend.logs(name, follow=True):
        typer.echo(line)
    return backend.status(name)


def _show_and_confirm(plan: Plan, name: str, *, yes: bool, as_json: bool) -> bool:
    """Show the plan table, and ask before anything costs money (unless --yes)."""
    from mncloud.cli.plan import show_learned, show_plan

    if not as_json:
        show_plan(plan, top=5)
        show_learned(plan)
    if yes:
        return True
    return typer.confirm(
        f"Launch {name} for an expected ${plan.choice.expected_cost:,.2f}?", default=False
    )
