"""`mncloud render`: print the SkyPilot task YAML for a training script."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json


def register(app: typer.Typer) -> None:
    """Add `render` to the app."""
    app.command("render")(render_command)


@handle_errors
def render_command(
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
    allow_secret_env: opts.AllowSecretEnv = None,
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
    launcher: opts.Launcher = None,
    ckpt_dir: opts.CkptDir = None,
    name: opts.Name = None,
    catalog: opts.Catalog = None,
    template: opts.Template = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the YAML to this file.")
    ] = None,
    as_json: opts.Json = False,
    with_plan: Annotated[
        bool,
        typer.Option(
            "--plan", help="Plan first; the winner and its fallbacks become `ordered` resources."
        ),
    ] = False,
    hours: opts.Hours = opts.DEFAULT_HOURS,
    max_cost: opts.MaxCost = None,
    preemption_rate: opts.PreemptionRate = None,
    learn: opts.Learn = False,
    recovery_minutes: opts.RecoveryMinutes = None,
    ckpt_seconds: opts.CkptSeconds = None,
) -> None:
    """Print the SkyPilot task YAML for SCRIPT, validated by SkyPilot's own schema."""
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(catalog)
    from mncloud.launch import prepare
    from mncloud.render import render

    spec = opts.spec_from_options(locals())
    launch_options = opts.launch_options_from(locals())
    if with_plan:
        task = prepare(spec, launch_options).task
    else:
        task = render(spec, template=launch_options.template)
    text = task.to_json() + "\n" if as_json else task.yaml_text
    if output is not None:
        output.write_text(text)
        console.print(f"wrote {output}", highlight=False)
    elif as_json:
        print_json(task.config)
    else:
        typer.echo(text, nl=False)
