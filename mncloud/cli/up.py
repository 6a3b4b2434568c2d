"""`mncloud up`: plan → render → launch, on a cloud through SkyPilot or on this machine."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mncloud.cli import render as opts
from mncloud.cli._common import console, err_console, handle_errors, print_json
from mncloud.constants import DEFAULT_MASTER_PORT
from mncloud.errors import SpecError

if TYPE_CHECKING:
    from mncloud.plan import Plan, PlanRequest


def register(app: typer.Typer) -> None:
    """Add `up` to the app."""
    app.command("up")(up_command)


def parse_duration(text: str | None, flag: str) -> float | None:
    """`90`, `90s`, `5m`, `1h` → seconds; None stays None."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise SpecError(f"{flag} {text!r}: write a duration like 30s, 5m or 1h")
    value = float(match.group(1))
    return value * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


@handle_errors
def up_command(
    script: opts.Script,
    script_args: opts.ScriptArgs = None,
    gpus: opts.Gpus = None,
    nodes: opts.Nodes = None,
    spot: opts.Spot = None,
    cloud: opts.Cloud = None,
    region: opts.Region = None,
    bucket: opts.Bucket = None,
    mount_bucket: opts.MountBucket = None,
    env: opts.Env = None,
    secret: opts.Secret = None,
    setup: opts.Setup = None,
    requirements: opts.Requirements = None,
    disk_size: opts.DiskSize = None,
    image: opts.Image = None,
    label: opts.Label = None,
    max_hourly: opts.MaxHourly = None,
    max_restarts: opts.MaxRestarts = None,
    master_port: opts.MasterPort = None,
    nccl_debug: opts.NcclDebug = None,
    nccl_socket_ifname: opts.NcclIfname = None,
    require_path: opts.RequirePath = None,
    preflight: opts.Preflight = None,
    name: opts.Name = None,
    catalog: opts.Catalog = None,
    template: Annotated[
        Path | None, typer.Option("--template", help="Your own Jinja2 task template.")
    ] = None,
    hours: Annotated[
        float, typer.Option("--hours", help="Expected training hours, for the plan.")
    ] = 24.0,
    max_cost: opts.MaxCost = None,
    preemption_rate: opts.PreemptionRate = None,
    learn: opts.Learn = False,
    recovery_minutes: opts.RecoveryMinutes = None,
    ckpt_seconds: opts.CkptSeconds = None,
    yes: opts.Yes = False,
    detach: opts.Detach = False,
    dryrun: opts.Dryrun = False,
    recovery_delay: Annotated[
        str, typer.Option("--recovery-delay", help="Local: wait before relaunching nodes.")
    ] = "2s",
    retry_on_error: Annotated[
        int | None,
        typer.Option(
            "--retry-on-error", help="Local: retries after errors in your code (default 0)."
        ),
    ] = None,
    chaos_preempt_after: Annotated[
        str | None,
        typer.Option(
            "--chaos-preempt-after",
            help="Local: preempt the last node once, this long after the first step (e.g. 10s).",
        ),
    ] = None,
    as_json: opts.StatusJson = False,
) -> None:
    """Plan, render and launch SCRIPT on the cheapest fitting cloud (or --cloud local)."""
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(catalog)
    from mncloud import runs
    from mncloud.backends.base import LaunchRequest, RunState, get_backend, record_backend
    from mncloud.render import render

    spec = opts.spec_from_options(locals())
    options = {
        "recovery_delay": parse_duration(recovery_delay, "--recovery-delay"),
        "retry_on_error": retry_on_error or 0,
        "chaos_preempt_after": parse_duration(chaos_preempt_after, "--chaos-preempt-after"),
        "follow": not detach and not as_json,
    }
    if spec.is_local:
        plan = None
        backend_name = "local"
        if master_port is None and spec.master_port == DEFAULT_MASTER_PORT:
            from mncloud.backends.local import free_port  # several local runs side by side

            spec = spec.model_copy(update={"master_port": free_port()})
    else:
        if "local" in spec.clouds:
            raise SpecError("--cloud local runs on this machine alone; do not mix it with clouds")
        from mncloud.cli.plan import learned_hazards
        from mncloud.plan import PlanRequest

        request = PlanRequest.from_spec(
            spec,
            hours=hours,
            max_cost=max_cost,
            preemption_rate=preemption_rate,
            learned=learned_hazards() if learn else None,
            recovery_minutes=recovery_minutes,
            ckpt_seconds=ckpt_seconds,
        )
        plan = _plan_and_confirm(request, spec.name, yes=yes or dryrun, as_json=as_json)
        backend_name = "skypilot"
    run_id = None if dryrun else runs.new_run_id(spec.name)
    task = render(spec, plan=plan, template=template, run_id=run_id)
    backend = get_backend(backend_name)
    if plan is not None and spec.bucket is not None and not dryrun:
        from mncloud.buckets import prepare_bucket

        _state, warning = prepare_bucket(
            spec.bucket, plan.choice.cloud, plan.choice.region, console.print
        )
        if warning:
            err_console.print(f"[yellow]warning:[/] {warning}")
    if run_id is not None:
        record_backend(spec.name, backend_name)
        runs.create_record(spec, task, plan, backend_name, run_id=run_id)
    request = LaunchRequest(
        spec=spec, task=task, plan=plan, detach=detach, dryrun=dryrun, options=options
    )
    status = backend.launch(request)
    if backend_name == "local" and options["follow"] and not dryrun:
        from mncloud.cli.follow import follow_local_run

        status = follow_local_run(spec.name)
    elif backend_name == "skypilot" and options["follow"] and not dryrun:
        for line in backend.logs(spec.name, follow=True):
            typer.echo(line)
        status = backend.status(spec.name)
    if as_json:
        print_json(status.model_dump(mode="json"))
    else:
        console.print(f"[bold]{status.name}[/]: {status.state.value} {status.detail}")
    if status.state is RunState.FAILED:
        raise typer.Exit(code=1)


def _plan_and_confirm(request: PlanRequest, name: str, *, yes: bool, as_json: bool) -> Plan:
    """Plan the job, show the table, and ask before anything costs money."""
    from mncloud.cli.plan import show_learned, show_plan
    from mncloud.plan import make_plan

    plan = make_plan(request)
    if not as_json:
        show_plan(plan, top=5)
        show_learned(plan)
    if not yes and not typer.confirm(
        f"Launch {name} for an expected ${plan.choice.expected_cost:,.2f}?", default=False
    ):
        raise typer.Exit(code=1)
    return plan
