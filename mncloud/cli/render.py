"""`mncloud render`: print the SkyPilot task YAML for a training script."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mncloud.cli._common import console, handle_errors, print_json

if TYPE_CHECKING:
    from mncloud.spec import JobSpec

# The options every command that takes a training job shares (render, up). One definition,
# so `render` and `up` cannot drift apart.
Gpus = Annotated[
    str | None,
    typer.Option("--gpus", help="Accelerators per node: H100:8, A100-80GB:4, L4, cpu:2."),
]
Nodes = Annotated[int | None, typer.Option("--nodes", help="Number of nodes (default 1).")]
Spot = Annotated[
    bool | None,
    typer.Option(
        "--spot/--on-demand", help="Force spot or on-demand; default: either, the plan decides."
    ),
]
Cloud = Annotated[
    list[str] | None,
    typer.Option("--cloud", help="Allowed cloud (repeatable): aws, gcp, lambda, … or local."),
]
Region = Annotated[list[str] | None, typer.Option("--region", help="Allowed region (repeatable).")]
Bucket = Annotated[
    str | None,
    typer.Option("--bucket", help="Checkpoint bucket: s3://name[/prefix], gs://…, file:///dir."),
]
MountBucket = Annotated[
    bool | None,
    typer.Option("--mount-bucket", help="Also mount the bucket (MOUNT_CACHED) on every node."),
]
Env = Annotated[
    list[str] | None, typer.Option("--env", help="Environment variable K=V (repeatable).")
]
Secret = Annotated[
    list[str] | None,
    typer.Option("--secret", help="Secret env var name, value read from your environment."),
]
Setup = Annotated[str | None, typer.Option("--setup", help="Shell command run once per node.")]
Requirements = Annotated[
    str | None, typer.Option("--requirements", help="pip requirements file inside the project.")
]
DiskSize = Annotated[int | None, typer.Option("--disk-size", help="Disk per node in GB.")]
Image = Annotated[str | None, typer.Option("--image", help="VM or Docker image (image_id).")]
Label = Annotated[list[str] | None, typer.Option("--label", help="Label K=V (repeatable).")]
MaxHourly = Annotated[
    float | None, typer.Option("--max-hourly", help="Budget: most USD per hour for the job.")
]
MaxRestarts = Annotated[
    int | None,
    typer.Option("--max-restarts", help="Restarts after errors in your code (default 3)."),
]
MasterPort = Annotated[
    int | None, typer.Option("--master-port", help="Rendezvous port on the head node (29500).")
]
NcclDebug = Annotated[
    str | None, typer.Option("--nccl-debug", help="NCCL_DEBUG level, e.g. INFO or WARN.")
]
NcclIfname = Annotated[
    str | None,
    typer.Option("--nccl-socket-ifname", help="NCCL_SOCKET_IFNAME; default: the default route's."),
]
Name = Annotated[str | None, typer.Option("--name", help="Run name (DNS-safe).")]
RequirePath = Annotated[
    list[str] | None,
    typer.Option("--require-path", help="A path or bucket URL every node must see (repeatable)."),
]
Preflight = Annotated[
    bool | None,
    typer.Option("--preflight/--no-preflight", help="Check every node before torchrun (on)."),
]
# Launch options shared by `up` and `rerun`.
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before launching.")]
Detach = Annotated[
    bool, typer.Option("--detach", "-d", help="Return once launched; do not follow logs.")
]
Dryrun = Annotated[
    bool, typer.Option("--dryrun", help="Plan, render and dry-run; provision nothing.")
]
StatusJson = Annotated[bool, typer.Option("--json", help="Print the final status as JSON.")]

# Planning options shared by `plan` and `up`.
MaxCost = Annotated[
    float | None,
    typer.Option("--max-cost", help="Budget: most USD the job may be expected to cost."),
]
PreemptionRate = Annotated[
    float | None,
    typer.Option(
        "--preemption-rate",
        help="Spot preemptions per node-hour for every cloud (default: per-cloud priors).",
    ),
]
Learn = Annotated[
    bool,
    typer.Option(
        "--learn",
        help="Blend the spot preemptions seen in this machine's run records into the priors.",
    ),
]
RecoveryMinutes = Annotated[
    float | None,
    typer.Option("--recovery-minutes", help="Minutes from a preemption to training again (10)."),
]
CkptSeconds = Annotated[
    float | None,
    typer.Option("--ckpt-seconds", help="Seconds training stalls to save a checkpoint (60)."),
]
Script = Annotated[Path, typer.Argument(help="The training script.", show_default=False)]
ScriptArgs = Annotated[
    list[str] | None, typer.Argument(help="Arguments for the script, after --.", show_default=False)
]
Catalog = Annotated[
    str | None,
    typer.Option(
        "--catalog",
        envvar="MNCLOUD_CATALOG_DIR",
        help="Offline SkyPilot catalog snapshot (a folder holding v8/<cloud>/vms.csv).",
    ),
]


def spec_from_options(values: dict[str, Any]) -> JobSpec:
    """Build the JobSpec from a command's parameters (its `locals()`), by `build_spec`'s names.

    `render` and `up` share every job option; this keeps them from drifting apart.
    """
    from mncloud.spec import build_spec

    names = [
        p.name
        for p in inspect.signature(build_spec).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return build_spec(
        values["script"], values["script_args"], **{name: values[name] for name in names}
    )


def register(app: typer.Typer) -> None:
    """Add `render` to the app."""
    app.command("render")(render_command)


@handle_errors
def render_command(
    script: Script,
    script_args: ScriptArgs = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
    spot: Spot = None,
    cloud: Cloud = None,
    region: Region = None,
    bucket: Bucket = None,
    mount_bucket: MountBucket = None,
    env: Env = None,
    secret: Secret = None,
    setup: Setup = None,
    requirements: Requirements = None,
    disk_size: DiskSize = None,
    image: Image = None,
    label: Label = None,
    max_hourly: MaxHourly = None,
    max_restarts: MaxRestarts = None,
    master_port: MasterPort = None,
    nccl_debug: NcclDebug = None,
    nccl_socket_ifname: NcclIfname = None,
    require_path: RequirePath = None,
    preflight: Preflight = None,
    name: Name = None,
    catalog: Catalog = None,
    template: Annotated[
        Path | None, typer.Option("--template", help="Render your own Jinja2 task template.")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the YAML to this file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the task as JSON.")] = False,
    with_plan: Annotated[
        bool,
        typer.Option(
            "--plan", help="Plan first; the winner and its fallbacks become `ordered` resources."
        ),
    ] = False,
    hours: Annotated[float, typer.Option("--hours", help="Hours of work, for --plan.")] = 24.0,
) -> None:
    """Print the SkyPilot task YAML for SCRIPT, validated by SkyPilot's own schema."""
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(catalog)
    from mncloud.render import render

    spec = spec_from_options(locals())
    plan = None
    if with_plan:
        from mncloud.plan import PlanRequest, make_plan

        plan = make_plan(PlanRequest.from_spec(spec, hours=hours))
    task = render(spec, plan=plan, template=template)
    text = task.to_json() + "\n" if as_json else task.yaml_text
    if output is not None:
        output.write_text(text)
        console.print(f"wrote {output}", highlight=False)
    elif as_json:
        print_json(task.config)
    else:
        typer.echo(text, nl=False)
