"""`mncloud up`: plan → render → launch (`mncloud.launch`), on a cloud or on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from mncloud.cli import options as opts
from mncloud.cli._common import console, err_console, handle_errors, print_json

if TYPE_CHECKING:
    from mncloud.backends.base import RunStatus
    from mncloud.launch import Existing
    from mncloud.plan import Plan
    from mncloud.spec import JobSpec, LaunchOptions


def register(app: typer.Typer) -> None:
    """Add `up` to the app."""
    app.command("up")(up_command)


@opts.command(
    opts.SCRIPT, opts.MARKET, opts.JOB, opts.PLANNING, opts.LAUNCH, opts.LOCAL, opts.DEADLINE
)
@handle_errors
def up_command(
    ctx: typer.Context,
    resume: opts.Resume = False,
    replace: opts.Replace = False,
    **values: Any,
) -> None:
    """Plan, render and launch SCRIPT on the cheapest fitting cloud (or --cloud local).

    With --deadline, a controller steers the run between spot and on-demand to finish in time.
    """
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(values["catalog"])
    from mncloud.launch import Existing

    if resume and replace:
        raise opts.SpecError("--resume and --replace exclude each other; pick one")
    existing = Existing.RESUME if resume else Existing.REPLACE if replace else Existing.REFUSE
    if values["deadline"] is not None or _deadline_only(values):
        _up_deadline({**values, "ctx": ctx}, existing)
        return
    launch_and_follow(
        opts.spec_from_options(values),
        opts.launch_options_from(values),
        existing=existing,
        yes=values["yes"],
        detach=values["detach"],
        dryrun=values["dryrun"],
        as_json=values["as_json"],
    )


_DEADLINE_ONLY = ("budget", "spot_trace", "time_scale", "spot_price", "on_demand_price")


def _deadline_only(values: dict[str, Any]) -> bool:
    return any(values.get(name) is not None for name in _DEADLINE_ONLY)


def _up_deadline(values: dict[str, Any], existing: Existing) -> None:
    """`up --deadline`: start the deadline controller (`mncloud.cli.control`)."""
    from mncloud.cli.control import start_deadline_run

    if values["deadline"] is None:
        raise opts.SpecError("--budget, --spot-trace, --time-scale and the prices need --deadline")
    deadline_s = opts.deadline_seconds(values["deadline"])
    assert deadline_s is not None
    numbers = opts.deadline_options(values)
    source = values["ctx"].get_parameter_source("hours")
    start_deadline_run(
        opts.spec_from_options(values),
        opts.launch_options_from(values),
        deadline_s=deadline_s,
        numbers=numbers,
        spot_trace=values["spot_trace"],
        hours_given=source is not None and source.name != "DEFAULT",
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
        status = _follow(launched.prepared.backend, spec.name)
    if as_json:
        print_json(status.model_dump(mode="json"))
    else:
        console.print(f"[bold]{status.name}[/]: {status.detail or status.state.value.lower()}")
    if status.state is RunState.FAILED:
        raise typer.Exit(code=1)


def _notify(text: str) -> None:
    if text.startswith("warning: "):
        err_console.print(f"[yellow]warning:[/] {text.removeprefix('warning: ')}", highlight=False)
    else:
        console.print(text, highlight=False)


def _follow(backend_name: str, name: str) -> RunStatus:
    """Follow a run until it ends: the local live view, or SkyPilot's log stream."""
    if backend_name == "local":
        from mncloud.cli.follow import follow_local_run

        return follow_local_run(name)
    from mncloud.backends.registry import get_backend

    backend = get_backend(backend_name)
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
