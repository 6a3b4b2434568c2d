"""Every CLI option, declared once: one help text and one default for each.

Commands take their parameters from here (`opts.Gpus`, `opts.Hours`, …), so `render`, `plan`,
`up` and `rerun` cannot drift apart, and `spec_from_options` / `launch_options_from` turn a
command's parameters into the core's models.
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mncloud.errors import SpecError
from mncloud.spec import DEFAULT_HOURS as DEFAULT_HOURS  # re-exported: commands default to it
from mncloud.spec import MAX_HOURS

if TYPE_CHECKING:
    from mncloud.spec import DeadlineOptions, JobSpec, LaunchOptions

# Job options (render, up): everything a JobSpec is built from.
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
AllowSecretEnv = Annotated[
    bool | None,
    typer.Option("--allow-secret-env", help="Accept an --env value that looks like a credential."),
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
Launcher = Annotated[
    str | None,
    typer.Option(
        "--launcher",
        help="What starts the script on every node: torchrun (default), accelerate, deepspeed, "
        "or none (the script itself, MASTER_ADDR/NODE_RANK/NNODES exported).",
    ),
]
CkptDir = Annotated[
    str | None,
    typer.Option(
        "--ckpt-dir",
        help="An absolute folder on every node, kept in the bucket across preemptions "
        "(MNCLOUD_CKPT_DIR), for scripts that save their own checkpoints, e.g. /ckpt.",
    ),
]
Recovery = Annotated[
    str | None,
    typer.Option(
        "--recovery",
        help="What a lost node costs: gang (relaunch every node from the bucket checkpoint) or "
        "node (replace that node only; the others train on and it heals from a live one; the "
        "script must use mncloud.train.Replicas). Default: node when the script does and runs "
        "on 2+ nodes, else gang.",
    ),
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
Template = Annotated[
    Path | None, typer.Option("--template", help="Render your own Jinja2 task template.")
]
Hours = Annotated[
    float,
    typer.Option(
        "--hours", min=0.0, help="Hours of work the job needs without interruptions (for the plan)."
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Resume = Annotated[
    bool,
    typer.Option("--resume", help="The name has an earlier run: continue from its checkpoint."),
]
Replace = Annotated[
    bool,
    typer.Option("--replace", help="The name has an earlier run: start over (keeps checkpoints)."),
]
# Local backend only.
RecoveryDelay = Annotated[
    str,
    typer.Option(
        "--provision-delay",
        "--recovery-delay",
        help="Local: the modeled time a cloud takes to provision a replacement (one node, or "
        "the whole gang) before it starts, e.g. 30s. A model, not a measurement.",
    ),
]
RetryOnError = Annotated[
    int | None,
    typer.Option("--retry-on-error", help="Local: retries after errors in your code (default 0)."),
]
ChaosPreemptAfter = Annotated[
    str | None,
    typer.Option(
        "--chaos-preempt-after",
        help="Local: preempt the last node once, this long after the first step (e.g. 10s).",
    ),
]


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", re.ASCII)


def parse_duration(text: str | None, flag: str, *, positive: bool = False) -> float | None:
    """`90`, `90s`, `5m`, `1h` → seconds, at most `MAX_HOURS`; None stays None. `positive`:
    0 is refused too."""
    if text is None:
        return None
    match = _DURATION.fullmatch(text)
    shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}…"
    if not match:
        raise SpecError(f"{flag} {shown}: write a duration like 30s, 5m or 1h")
    value = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if not math.isfinite(value) or value > MAX_HOURS * 3600:
        raise SpecError(f"{flag} {shown}: at most a year ({MAX_HOURS} h), e.g. 30h")
    if positive and value <= 0:
        raise SpecError(f"{flag} {shown}: it must be longer than 0, e.g. 30h")
    return value


def deadline_seconds(text: str | None) -> float | None:
    """`--deadline` in seconds (None without it): one reading for `up`, `plan` and `replay`."""
    return parse_duration(text, "--deadline", positive=True)


def deadline_options(values: dict[str, Any]) -> DeadlineOptions:
    """The numbers beside `--deadline` in a command's parameters, checked (`DeadlineOptions`)."""
    from mncloud.spec import DeadlineOptions

    return DeadlineOptions.build(
        **{k: values.get(k) for k in DeadlineOptions.model_fields if values.get(k) is not None}
    )


def launch_options_from(values: dict[str, Any]) -> LaunchOptions:
    """The LaunchOptions from a command's parameters (its `locals()`); absent ones default."""
    from pydantic import ValidationError

    from mncloud.errors import first_error
    from mncloud.spec import LaunchOptions

    fields = dict(values)
    for name, flag in (
        ("recovery_delay", "--provision-delay"),
        ("chaos_preempt_after", "--chaos-preempt-after"),
    ):
        if isinstance(fields.get(name), str):
            fields[name] = parse_duration(fields[name], flag)
    known = {k: v for k, v in fields.items() if k in LaunchOptions.model_fields and v is not None}
    try:
        return LaunchOptions(**known)
    except ValidationError as err:
        raise SpecError(first_error(err)) from None


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
    """Build the JobSpec from a command's parameters, by the names `build_spec` takes."""
    from mncloud.request import build_spec, flag_names

    options = {name: values[name] for name in flag_names()}
    return build_spec(values["script"], values["script_args"], **options)


# Deadline runs (`up --deadline`, the controller is `mncloud control`; `plan --deadline`, its
# estimate; `replay --deadline`, a policy over a trace). One option, read by `deadline_seconds`.
Deadline = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        help="Finish within this long of the start (e.g. 30h, 90m) at the least cost: a policy "
        "switches between spot and on-demand to meet it.",
    ),
]
Budget = Annotated[
    float | None,
    typer.Option(
        "--budget",
        help="With --deadline: a hard cap in USD; the run stops cleanly (checkpoint kept) "
        "before it would cross it.",
    ),
]
SpotTrace = Annotated[
    Path | None,
    typer.Option(
        "--spot-trace",
        help="Local rehearsal: spot capacity follows this trace "
        '({"metadata": {"gap_seconds": N}, "data": [nodes per tick]}).',
    ),
]
TimeScale = Annotated[
    float | None,
    typer.Option(
        "--time-scale",
        help="Local rehearsal: run time passes this many times faster than wall time "
        "(trace, deadline, --hours).",
    ),
]
SpotPrice = Annotated[
    float | None,
    typer.Option(
        "--spot-price",
        help="With --deadline: USD per node-hour on spot (local: 0.918; clouds: the plan's).",
    ),
]
OnDemandPrice = Annotated[
    float | None,
    typer.Option(
        "--on-demand-price",
        help="With --deadline: USD per node-hour on-demand (local: 3.06; clouds: the plan's).",
    ),
]
# `plan --deadline`'s budget (a warning, where `up`'s is a hard cap) and its hazards.
PlanBudget = Annotated[
    float | None,
    typer.Option(
        "--budget",
        help="With --deadline: most USD the run may be expected to cost; warns above it.",
    ),
]
HazardsFrom = Annotated[
    list[Path] | None,
    typer.Option(
        "--hazards-from",
        help="Spot trace JSON to measure preemption hazards from (repeatable); its metadata "
        "`cloud`/`region` or its path says where it applies.",
    ),
]


# --------------------------------------------------------------------------- parameter groups
# Which options a command takes is declared here once, by group; `command(...)` gives a
# command function the groups' parameters, so no parameter list is written twice.

_EMPTY = inspect.Parameter.empty


def _group(*items: tuple[str, Any, Any]) -> tuple[inspect.Parameter, ...]:
    kind = inspect.Parameter.KEYWORD_ONLY
    return tuple(inspect.Parameter(n, kind, annotation=a, default=d) for n, a, d in items)


SCRIPT = _group(("script", Script, _EMPTY), ("script_args", ScriptArgs, None))
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
    ("require_path", RequirePath, None),
    ("preflight", Preflight, None),
    ("launcher", Launcher, None),
    ("ckpt_dir", CkptDir, None),
    ("recovery", Recovery, None),
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
)
#: How `up` and `rerun` launch.
LAUNCH = _group(
    ("yes", Yes, False),
    ("detach", Detach, False),
    ("dryrun", Dryrun, False),
    ("as_json", StatusJson, False),
)
#: Local backend only (`up --cloud local`).
LOCAL = _group(
    ("recovery_delay", RecoveryDelay, "2s"),
    ("retry_on_error", RetryOnError, None),
    ("chaos_preempt_after", ChaosPreemptAfter, None),
)
#: `up --deadline` (the live controller).
DEADLINE = _group(
    ("deadline", Deadline, None),
    ("budget", Budget, None),
    ("spot_trace", SpotTrace, None),
    ("time_scale", TimeScale, None),
    ("spot_price", SpotPrice, None),
    ("on_demand_price", OnDemandPrice, None),
)


def command(*groups: tuple[inspect.Parameter, ...]) -> Any:
    """Decorator: the command function takes its own parameters, then the groups' ones.

    The function declares its own options as usual and `**values` for the shared ones; Typer
    reads the combined signature, so `mncloud up --help` lists every option of every group.
    """

    def wrap(func: Any) -> Any:
        own = [
            p
            for p in inspect.signature(func, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        shared = [p for group in groups for p in group]
        func.__signature__ = inspect.Signature([*own, *shared])
        return func

    return wrap
