"""The job's options (`render`, `up`, and `plan` for the market), declared once: one help text
and one default each; everything a `JobSpec` is built from (`mncloud.options.JobOptions`).
`cli/options.py` groups them with the rest for the commands (`opts.Gpus`, `opts.JOB`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mncloud.cli.params import ADVANCED, ESSENTIALS, PLAN_PANEL
from mncloud.options import job_default, meta


def _range(name: str) -> str:
    """A job option's bounds as its help says them (`1 to 1024`): its field's metadata."""
    bounds = meta(name)
    return f"{bounds.ge:g} to {bounds.le:g}"


# Job options (render, up): everything a JobSpec is built from.
Gpus = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        rich_help_panel=ESSENTIALS,
        help="Accelerators per node: H100:8, A100-80GB:4, L4, cpu:2; several GPU types, "
        "comma-separated (H100:8,A100-80GB:8), are ranked by expected cost to finish.",
    ),
]
Nodes = Annotated[
    int | None,
    typer.Option(
        "--nodes",
        rich_help_panel=ESSENTIALS,
        help=f"Number of nodes, {_range('nodes')} (default {job_default('nodes')}).",
    ),
]
MinNodes = Annotated[
    int | None,
    typer.Option(
        "--min-nodes",
        rich_help_panel=ADVANCED,
        help="Elastic spot run: train on as few as this many nodes while spot capacity gives "
        "fewer than --nodes (from the newest checkpoint, resharded, the global batch kept), "
        "and grow back at the next checkpoint. Default: the gang waits for all --nodes.",
    ),
]
Spot = Annotated[
    bool | None,
    typer.Option(
        "--spot/--on-demand",
        rich_help_panel=ESSENTIALS,
        help="Force spot or on-demand; default: either, the plan decides.",
    ),
]
Cloud = Annotated[
    list[str] | None,
    typer.Option(
        "--cloud",
        rich_help_panel=ESSENTIALS,
        help="Allowed cloud (repeatable): aws, gcp, lambda, … or local.",
    ),
]
Region = Annotated[
    list[str] | None,
    typer.Option("--region", rich_help_panel=ESSENTIALS, help="Allowed region (repeatable)."),
]
Bucket = Annotated[
    str | None,
    typer.Option(
        "--bucket",
        rich_help_panel=ESSENTIALS,
        help="Checkpoint bucket: s3://name[/prefix], gs://…, file:///dir.",
    ),
]
MountBucket = Annotated[
    bool | None,
    typer.Option(
        "--mount-bucket",
        rich_help_panel=ADVANCED,
        help="Also mount the bucket (MOUNT_CACHED) on every node.",
    ),
]
Env = Annotated[
    list[str] | None,
    typer.Option(
        "--env", rich_help_panel=ESSENTIALS, help="Environment variable K=V (repeatable)."
    ),
]
AllowSecretEnv = Annotated[
    bool | None,
    typer.Option(
        "--allow-secret-env",
        rich_help_panel=ADVANCED,
        help="Accept an --env value that looks like a credential.",
    ),
]
Secret = Annotated[
    list[str] | None,
    typer.Option(
        "--secret",
        rich_help_panel=ESSENTIALS,
        help="Secret env var name, value read from your environment.",
    ),
]
Setup = Annotated[
    str | None,
    typer.Option("--setup", rich_help_panel=ESSENTIALS, help="Shell command run once per node."),
]
Requirements = Annotated[
    str | None,
    typer.Option(
        "--requirements",
        rich_help_panel=ESSENTIALS,
        help="pip requirements file inside the project.",
    ),
]
DiskSize = Annotated[
    int | None, typer.Option("--disk-size", rich_help_panel=ADVANCED, help="Disk per node in GB.")
]
Image = Annotated[
    str | None,
    typer.Option("--image", rich_help_panel=ADVANCED, help="VM or Docker image (image_id)."),
]
Label = Annotated[
    list[str] | None,
    typer.Option("--label", rich_help_panel=ADVANCED, help="Label K=V (repeatable)."),
]
MaxHourly = Annotated[
    float | None,
    typer.Option(
        "--max-hourly", rich_help_panel=PLAN_PANEL, help="Budget: most USD per hour for the job."
    ),
]
MaxRestarts = Annotated[
    int | None,
    typer.Option(
        "--max-restarts",
        rich_help_panel=ADVANCED,
        help="Retries after errors in your code, on every backend "
        f"(default {job_default('max_restarts')}). Preemptions are "
        "always recovered and never count against it.",
    ),
]
MasterPort = Annotated[
    int | None,
    typer.Option(
        "--master-port",
        rich_help_panel=ADVANCED,
        help=f"Rendezvous port on the head node, {_range('master_port')} (29500).",
    ),
]
NcclDebug = Annotated[
    str | None,
    typer.Option(
        "--nccl-debug", rich_help_panel=ADVANCED, help="NCCL_DEBUG level, e.g. INFO or WARN."
    ),
]
NcclIfname = Annotated[
    str | None,
    typer.Option(
        "--nccl-socket-ifname",
        rich_help_panel=ADVANCED,
        help="NCCL_SOCKET_IFNAME; default: the default route's.",
    ),
]
Network = Annotated[
    str | None,
    typer.Option(
        "--network",
        rich_help_panel=ADVANCED,
        help=f"best or standard: {job_default('network')} asks 2+ node tasks for each "
        "offer's fast fabric (network_tier: best on AWS EFA, GCP a3-high TCPX, Nebius IB); "
        "standard keeps TCP.",
    ),
]
Parallelism = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        rich_help_panel=ADVANCED,
        help="How the model is spread over the GPUs: ddp (a replica on each), fsdp (sharded "
        "over all) or hsdp (sharded in a node, replicated across nodes; 2+ nodes). Reaches the "
        "script as $MNCLOUD_PARALLEL (mncloud.train.parallelize). Default: the script's choice.",
    ),
]
MinBandwidth = Annotated[
    float | None,
    typer.Option(
        "--min-bandwidth",
        rich_help_panel=ADVANCED,
        metavar="GBPS",
        help="Refuse to train when the preflight's all-reduce bus bandwidth between nodes is "
        "below GBPS GB/s (default: warn when far below the plan's expectation).",
    ),
]
Name = Annotated[
    str | None,
    typer.Option(
        "--name",
        rich_help_panel=ESSENTIALS,
        help="Run name (DNS-safe); default: the script's name and a new suffix per up, "
        "e.g. train-3f9a.",
    ),
]
RequirePath = Annotated[
    list[str] | None,
    typer.Option(
        "--require-path",
        rich_help_panel=ADVANCED,
        help="A path or bucket URL every node must see (repeatable).",
    ),
]
Preflight = Annotated[
    bool | None,
    typer.Option(
        "--preflight/--no-preflight",
        rich_help_panel=ADVANCED,
        help=f"Check every node before torchrun ({'on' if job_default('preflight') else 'off'}).",
    ),
]
Launcher = Annotated[
    str | None,
    typer.Option(
        "--launcher",
        rich_help_panel=ADVANCED,
        help=f"What starts the script on every node: {job_default('launcher')} (default), "
        "accelerate, deepspeed, or none (the script itself, MASTER_ADDR/NODE_RANK/NNODES "
        "exported).",
    ),
]
CkptDir = Annotated[
    str | None,
    typer.Option(
        "--ckpt-dir",
        rich_help_panel=ADVANCED,
        help="An absolute folder on every node, kept in the bucket across preemptions "
        "(MNCLOUD_CKPT_DIR), for scripts that save their own checkpoints, e.g. /ckpt.",
    ),
]
ResumeArgs = Annotated[
    str | None,
    typer.Option(
        "--resume-args",
        rich_help_panel=ADVANCED,
        help="With --ckpt-dir: arguments added to the script's only when its node starts with "
        "a committed checkpoint, {ckpt} being the newest one's path there, e.g. "
        "'--resume_from_checkpoint {ckpt}' or '--init_from=resume'.",
    ),
]
Tracker = Annotated[
    str | None,
    typer.Option(
        "--tracker",
        rich_help_panel=ADVANCED,
        help="auto (default): every attempt logs into one W&B / MLflow / TensorBoard run "
        "(WANDB_RUN_ID, MLFLOW_RUN_ID, MNCLOUD_TB_DIR; docs/guides/trackers.md); none: mncloud "
        "sets no tracker variable and creates no tracker run.",
    ),
]
Recovery = Annotated[
    str | None,
    typer.Option(
        "--recovery",
        rich_help_panel=ADVANCED,
        help="What a lost node costs: gang (relaunch every node from the bucket checkpoint) or "
        "node (replace that node only; the others train on and it heals from a live one; the "
        "script must use mncloud.train.Replicas). Default: node when the script does, runs on "
        "2+ nodes and has an s3:// or gs:// bucket (or runs locally), else gang.",
    ),
]
