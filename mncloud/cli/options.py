"""Every CLI option, declared once: one help text and one default for each.

Commands take their parameters from here (`opts.Gpus`, `opts.Hours`, …), so `render`, `plan`,
`up` and `rerun` cannot drift apart, and `spec_from_options` / `launch_options_from` turn a
command's parameters into the core's models. The job's options are declared in
`cli/job_options.py`, the planner's and the deadline's in `cli/plan_options.py`; here are the
launch, cluster, exec and local options and the parameter groups every command is built from.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated

import typer

from mncloud.cli.job_options import (
    AllowSecretEnv,
    Bucket,
    CkptDir,
    Cloud,
    DiskSize,
    Env,
    Gpus,
    Image,
    Label,
    Launcher,
    MasterPort,
    MaxHourly,
    MaxRestarts,
    MinBandwidth,
    MinNodes,
    MountBucket,
    Name,
    NcclDebug,
    NcclIfname,
    Network,
    Nodes,
    Parallelism,
    Preflight,
    Recovery,
    Region,
    Requirements,
    RequirePath,
    ResumeArgs,
    Secret,
    Setup,
    Spot,
    Tracker,
)
from mncloud.cli.params import ADVANCED, ESSENTIALS, LOCAL_PANEL, PLAN_PANEL
from mncloud.cli.params import command as command
from mncloud.cli.params import group as _group
from mncloud.cli.plan_options import (  # noqa: F401 - re-exported: commands read opts.X
    Budget,
    CkptSeconds,
    Deadline,
    FlopsPerStep,
    GradBytes,
    HazardsFrom,
    Hidden,
    Hours,
    Layers,
    Learn,
    MaxCost,
    MicroBatches,
    Minimize,
    OnDemandPrice,
    PaceSteps,
    Params,
    PlanBudget,
    PlanParallel,
    PreemptionRate,
    ProfileFirst,
    Recompute,
    RecoveryMinutes,
    SeqLen,
    SpotPrice,
    SpotTrace,
    Steps,
    TimeScale,
    TokensPerStep,
    Wide,
)
from mncloud.cli.values import deadline_options as deadline_options
from mncloud.cli.values import deadline_seconds as deadline_seconds
from mncloud.cli.values import job_options as job_options
from mncloud.cli.values import launch_options_from as launch_options_from
from mncloud.cli.values import parse_duration as parse_duration
from mncloud.cli.values import print_notices as print_notices
from mncloud.cli.values import retry_alias as retry_alias
from mncloud.cli.values import spec_from_options as spec_from_options
from mncloud.errors import SpecError as SpecError  # re-exported: commands raise it
from mncloud.options import DEFAULT_HOURS as DEFAULT_HOURS  # re-exported: commands default to it
from mncloud.options import DEFAULT_IDLE_MINUTES

# Launch options shared by `up` and `rerun`.
Yes = Annotated[
    bool,
    typer.Option("--yes", "-y", rich_help_panel=ESSENTIALS, help="Do not ask before launching."),
]
Detach = Annotated[
    bool,
    typer.Option(
        "--detach",
        "-d",
        rich_help_panel=ESSENTIALS,
        help="Return once launched; do not follow logs.",
    ),
]
Dryrun = Annotated[
    bool,
    typer.Option(
        "--dryrun", rich_help_panel=ESSENTIALS, help="Plan, render and dry-run; provision nothing."
    ),
]
StatusJson = Annotated[
    bool, typer.Option("--json", rich_help_panel=ESSENTIALS, help="Print the final status as JSON.")
]

Template = Annotated[
    Path | None,
    typer.Option(
        "--template", rich_help_panel=ADVANCED, help="Render your own Jinja2 task template."
    ),
]
Json = Annotated[bool, typer.Option("--json", rich_help_panel=ESSENTIALS, help="Print JSON.")]
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        rich_help_panel=ESSENTIALS,
        help="The name has an earlier run: continue from its newest complete checkpoint "
        "(without --name: this script's newest run).",
    ),
]
Replace = Annotated[
    bool,
    typer.Option(
        "--replace",
        rich_help_panel=ESSENTIALS,
        help="The name has an earlier run (without --name: this script's newest): start over "
        "from step 0. Its local checkpoints are "
        "set aside, never deleted; a --bucket that holds checkpoints for the name is refused.",
    ),
]
ExportOnFinish = Annotated[
    str | None,
    typer.Option(
        "--export-on-finish",
        rich_help_panel=ADVANCED,
        help="When the run succeeds, node 0 exports the last checkpoint's model (safetensors or "
        "torch) into <bucket>/<name>/export, recorded in the run record (mncloud export).",
    ),
]
# A plain cluster kept up for `mncloud exec` (`up --cluster`), and `exec` itself.
Cluster = Annotated[
    bool,
    typer.Option(
        "--cluster",
        rich_help_panel=ESSENTIALS,
        help="Keep a plain cluster up (on-demand unless --spot; no recovery) so `mncloud exec "
        "NAME` reruns on it in seconds; it tears down after --idle-minutes without a job. "
        "Locally: each node keeps a warm Python (torch imported) for exec's workers.",
    ),
]
IdleMinutes = Annotated[
    int | None,
    typer.Option(
        "--idle-minutes",
        rich_help_panel=ESSENTIALS,
        help=f"With --cluster: idle minutes before the cluster tears itself down "
        f"({DEFAULT_IDLE_MINUTES}).",
    ),
]
Restart = Annotated[
    bool,
    typer.Option(
        "--restart",
        rich_help_panel=ESSENTIALS,
        help="Start over from step 0 (default: resume from the newest complete checkpoint). "
        "Local checkpoints are set aside, never deleted; a bucket that holds some is refused.",
    ),
]
ExecName = Annotated[
    str, typer.Argument(help="The run (from `up --cluster`, or any local run).", show_default=False)
]
ExecScript = Annotated[
    Path | None,
    typer.Argument(
        help="Another script in the run's project folder (default: the run's).", show_default=False
    ),
]
# Local backend only.
RecoveryDelay = Annotated[
    str,
    typer.Option(
        "--provision-delay",
        "--recovery-delay",
        rich_help_panel=LOCAL_PANEL,
        help="Local: the modeled time a cloud takes to provision a replacement (one node, or "
        "the whole gang) before it starts, e.g. 30s. A model, not a measurement.",
    ),
]
RetryOnError = Annotated[
    int | None,
    typer.Option(
        "--retry-on-error",
        hidden=True,
        help="Deprecated: --max-restarts (retries after errors in your code, every backend).",
    ),
]
ChaosPreemptAfter = Annotated[
    str | None,
    typer.Option(
        "--chaos-preempt-after",
        rich_help_panel=LOCAL_PANEL,
        help="Local: preempt the last node once, this long after the first step (e.g. 10s).",
    ),
]

PreflightAlways = Annotated[
    bool,
    typer.Option(
        "--preflight-always",
        rich_help_panel=LOCAL_PANEL,
        help="Local: the bandwidth test at every launch (a relaunch on nodes that all predate "
        "the run's figure reuses it otherwise).",
    ),
]


Script = Annotated[Path, typer.Argument(help="The training script.", show_default=False)]
ScriptArgs = Annotated[
    list[str] | None, typer.Argument(help="Arguments for the script, after --.", show_default=False)
]
Catalog = Annotated[
    str | None,
    typer.Option(
        "--catalog",
        rich_help_panel=PLAN_PANEL,
        envvar="MNCLOUD_CATALOG_DIR",
        help="Offline SkyPilot catalog snapshot (a folder holding v8/<cloud>/vms.csv).",
    ),
]


# --------------------------------------------------------------------------- parameter groups
# Which options a command takes is declared here once, by group; `command(...)` gives a
# command function the groups' parameters, so no parameter list is written twice.

SCRIPT = _group(("script", Script, inspect.Parameter.empty), ("script_args", ScriptArgs, None))
#: What to run on and where: the part of a job `plan` needs too.
MARKET = _group(
    ("gpus", Gpus, None),
    ("nodes", Nodes, None),
    ("spot", Spot, None),
    ("cloud", Cloud, None),
    ("region", Region, None),
    ("max_hourly", MaxHourly, None),
    ("catalog", Catalog, None),
)
#: The rest of a job (`JobSpec`), for `render` and `up`.
JOB = _group(
    ("bucket", Bucket, None),
    ("mount_bucket", MountBucket, None),
    ("env", Env, None),
    ("secret", Secret, None),
    ("allow_secret_env", AllowSecretEnv, None),
    ("setup", Setup, None),
    ("requirements", Requirements, None),
    ("disk_size", DiskSize, None),
    ("image", Image, None),
    ("label", Label, None),
    ("max_restarts", MaxRestarts, None),
    ("master_port", MasterPort, None),
    ("nccl_debug", NcclDebug, None),
    ("nccl_socket_ifname", NcclIfname, None),
    ("network", Network, None),
    ("min_bandwidth", MinBandwidth, None),
    ("require_path", RequirePath, None),
    ("preflight", Preflight, None),
    ("launcher", Launcher, None),
    ("ckpt_dir", CkptDir, None),
    ("resume_args", ResumeArgs, None),
    ("recovery", Recovery, None),
    ("parallel", Parallelism, None),
    ("tracker", Tracker, None),
    ("min_nodes", MinNodes, None),
    ("name", Name, None),
    ("template", Template, None),
)
#: The planner's model (`plan`, `render --plan`, `up`).
PLANNING = _group(
    ("hours", Hours, DEFAULT_HOURS),
    ("max_cost", MaxCost, None),
    ("preemption_rate", PreemptionRate, None),
    ("learn", Learn, False),
    ("recovery_minutes", RecoveryMinutes, None),
    ("ckpt_seconds", CkptSeconds, None),
    ("hazards_from", HazardsFrom, None),
    ("steps", Steps, None),
    ("minimize", Minimize, None),
    ("params", Params, None),
    ("flops_per_step", FlopsPerStep, None),
    ("tokens_per_step", TokensPerStep, None),
    ("seq_len", SeqLen, None),
    ("layers", Layers, None),
    ("hidden", Hidden, None),
    ("recompute", Recompute, None),
    ("micro_batches", MicroBatches, None),
    ("grad_bytes", GradBytes, None),
)
#: What `up` does when the name already has a run.
EXISTING = _group(("resume", Resume, False), ("replace", Replace, False))
#: How `up` and `rerun` launch.
LAUNCH = _group(
    ("yes", Yes, False),
    ("detach", Detach, False),
    ("dryrun", Dryrun, False),
    ("as_json", StatusJson, False),
)
#: `up --cluster`: a plain cluster kept up for `mncloud exec`.
CLUSTER = _group(("cluster", Cluster, False), ("idle_minutes", IdleMinutes, None))
#: `mncloud exec NAME [SCRIPT] [-- ARGS]`.
EXEC = _group(
    ("name", ExecName, inspect.Parameter.empty),
    ("script", ExecScript, None),
    ("script_args", ScriptArgs, None),
    ("restart", Restart, False),
    ("detach", Detach, False),
    ("as_json", StatusJson, False),
)
#: Local backend only (`up --cloud local`).
LOCAL = _group(
    ("recovery_delay", RecoveryDelay, "2s"),
    ("retry_on_error", RetryOnError, None),
    ("chaos_preempt_after", ChaosPreemptAfter, None),
    ("preflight_always", PreflightAlways, False),
)
#: `up --deadline` (the live controller).
DEADLINE = _group(
    ("deadline", Deadline, None),
    ("budget", Budget, None),
    ("spot_trace", SpotTrace, None),
    ("time_scale", TimeScale, None),
    ("pace_steps", PaceSteps, None),
    ("spot_price", SpotPrice, None),
    ("on_demand_price", OnDemandPrice, None),
)
