"""The job's options as plain data: each option's name, type, default and bounds, stated once.

`JobOptions` holds what a user said for a job, by flag or `mncloud.yaml` key (None: not said);
its fields' metadata (`Meta`) holds the default the spec falls back to and the bounds a value
must keep. `mncloud.spec` declares `JobSpec`'s defaults and bounds from it, `mncloud.request`
derives `mncloud.yaml`'s keys from it, and the CLI's help text reads it. Standard library only,
so `mncloud --help` loads neither pydantic nor the spec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: The most nodes one run may ask for: beyond any single offer (the largest clusters SkyPilot
#: documents are hundreds of nodes) and a guard against a typo that would cost a fortune.
MAX_NODES = 1024
MIN_NODES = 1
#: The longest a job's work, a deadline or any other duration an option takes may be: a year.
#: Longer is a typo (or `1e308`), and the models' tick counts would overflow.
MAX_HOURS = 24 * 365
#: The most USD any money option (a budget, a price per hour) may name.
MAX_USD = 1e9
#: Hours of work the planner assumes when the user gives none (`plan`, `render --plan`, `up`).
DEFAULT_HOURS = 24.0
#: R, a launch's time to training again when `--recovery-minutes` is not given: detect the
#: preemption, provision a new cluster (minutes for 8-GPU VMs), run setup and load the
#: checkpoint. SkyPilot's managed-job recovery usually takes several minutes; 10 is a guess.
DEFAULT_RECOVERY_MINUTES = 10.0
#: C: time the training loop stalls to write one checkpoint (async uploads keep it short).
DEFAULT_CKPT_SECONDS = 60.0
#: `up --cluster`: idle minutes (no job running) before the cluster tears itself down.
DEFAULT_IDLE_MINUTES = 10


@dataclass(frozen=True)
class Meta:
    """What a job option's field declares beside its type: the spec's default when neither
    flag nor `mncloud.yaml` says a value, the bounds of a number, and whether `mncloud.yaml`
    may set it."""

    default: Any = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    in_yaml: bool = True

    def bounds(self) -> dict[str, float]:
        """The bounds as pydantic `Field` keywords (`ge=1, le=1024`)."""
        return {
            k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le)) if v is not None
        }


def _m(**meta: Any) -> dict[str, Meta]:
    """A `JobOptions` field's metadata."""
    return {"mncloud": Meta(**meta)}


@dataclass(frozen=True)
class JobOptions:
    """A job's options as the user said them: flags over `mncloud.yaml`, named like the flags
    (`_` for `-`); None is "not said". `mncloud.request.spec_from` builds the `JobSpec` from
    it, field by field. The types take what `mncloud.yaml` may hold too (one word or a list,
    a mapping or `K=V` items)."""

    gpus: str | None = field(default=None, metadata=_m())
    """Accelerators per node, `NAME:COUNT`, e.g. `H100:8` or `cpu:2`; several types comma-separated
    are ranked by expected cost to finish."""
    nodes: int | None = field(default=None, metadata=_m(default=1, ge=MIN_NODES, le=MAX_NODES))
    """Number of nodes."""
    min_nodes: int | None = field(default=None, metadata=_m())
    """Elastic spot run: the fewest nodes it trains on while capacity is short."""
    spot: bool | str | None = field(default=None, metadata=_m())
    """`true`: spot only, `false`: on-demand only; or `spot`, `on-demand`, `either` (default:
    either, the plan decides)."""
    cloud: str | list[str] | None = field(default=None, metadata=_m())
    """Allowed cloud, one or a list: `aws`, `gcp`, … or `local`."""
    region: str | list[str] | None = field(default=None, metadata=_m())
    """Allowed region, one or a list."""
    bucket: str | None = field(default=None, metadata=_m())
    """Checkpoint bucket: `s3://name[/prefix]`, `gs://…`, `file:///dir`."""
    mount_bucket: bool | None = field(default=None, metadata=_m())
    """Also mount the bucket on every node, `MOUNT_CACHED`."""
    env: list[str] | dict[str, Any] | None = field(default=None, metadata=_m())
    """Environment variables: a mapping, or a list of `K=V`."""
    secret: str | list[str] | None = field(default=None, metadata=_m())
    """Secret variable names, one or a list; values read from your environment at launch."""
    setup: str | None = field(default=None, metadata=_m())
    """Shell command run once per node."""
    requirements: str | None = field(default=None, metadata=_m())
    """pip requirements file inside the project."""
    disk_size: int | None = field(default=None, metadata=_m(ge=1, le=65536))
    """Disk per node in GB."""
    image: str | None = field(default=None, metadata=_m())
    """VM or Docker image, SkyPilot's `image_id`."""
    label: list[str] | dict[str, Any] | None = field(default=None, metadata=_m())
    """Labels: a mapping, or a list of `K=V`."""
    max_hourly: float | None = field(default=None, metadata=_m(gt=0, le=MAX_USD))
    """Budget: the most USD per hour for the job."""
    max_restarts: int | None = field(default=None, metadata=_m(default=3, ge=0, le=1000))
    """Retries after errors in your code."""
    master_port: int | None = field(default=None, metadata=_m(ge=1024, le=65535))
    """Rendezvous port on the head node."""
    nccl_debug: str | None = field(default=None, metadata=_m())
    """`NCCL_DEBUG` level, e.g. `INFO`."""
    nccl_socket_ifname: str | None = field(default=None, metadata=_m())
    """`NCCL_SOCKET_IFNAME`: the network interface NCCL uses."""
    network: str | None = field(default=None, metadata=_m(default="best"))
    """`best`: the cloud's fast fabric where an instance type has one (EFA, GPUDirect-TCPX,
    InfiniBand); `standard`: TCP on every entry."""
    min_bandwidth: float | None = field(default=None, metadata=_m(gt=0))
    """Refuse to train when the preflight's all-reduce bus bandwidth is below this many GB/s."""
    require_path: str | list[str] | None = field(default=None, metadata=_m())
    """Paths or bucket URLs every node must see, one or a list."""
    preflight: bool | None = field(default=None, metadata=_m(default=True))
    """Check every node before training."""
    launcher: str | None = field(default=None, metadata=_m(default="torchrun"))
    """What starts the script on every node: `torchrun`, `accelerate`, `deepspeed` or `none`."""
    ckpt_dir: str | None = field(default=None, metadata=_m())
    """An absolute folder on every node, kept in the bucket (for a script that saves its own
    checkpoints)."""
    resume_args: str | None = field(default=None, metadata=_m())
    """With `ckpt_dir`: arguments added to the script's on a node that starts with a committed
    checkpoint in it, `{ckpt}` the newest one's path (e.g. `--resume_from_checkpoint {ckpt}`)."""
    recovery: str | None = field(default=None, metadata=_m())
    """`gang` (every node relaunched on a loss) or `node` (only the lost node is replaced)."""
    parallel: str | None = field(default=None, metadata=_m())
    """The model's layout: `ddp`, `fsdp` or `hsdp` (default: the script's own `default=`)."""
    tracker: str | None = field(default=None, metadata=_m(default="auto"))
    """`auto`: one experiment-tracker run per training run (W&B, MLflow, TensorBoard; see
    docs/guides/trackers.md); `none`: mncloud sets no tracker variable and creates no run."""
    name: str | None = field(default=None, metadata=_m())
    """Run name; a name you give: a second `up` needs `--resume` or `--replace`."""
    allow_secret_env: bool | None = field(default=None, metadata=_m(in_yaml=False))
    """Accept an `--env` value that looks like a credential; said on the command line each
    time, never committed in `mncloud.yaml`."""

    def over(self, base: JobOptions) -> JobOptions:
        """These options over `base` (`mncloud.yaml`'s): a field said here (not None, not an
        empty list) wins, else `base`'s."""
        mine = (getattr(self, name) for name in JOB_FIELDS)
        theirs = (getattr(base, name) for name in JOB_FIELDS)
        return JobOptions(
            *(m if m not in (None, []) else t for m, t in zip(mine, theirs, strict=True))
        )


def meta(name: str) -> Meta:
    """The metadata of `JobOptions.<name>`."""
    return JOB_FIELDS[name].metadata["mncloud"]  # type: ignore[no-any-return]


def job_default(name: str) -> Any:
    """The default of a job option when neither flag nor `mncloud.yaml` says it."""
    return meta(name).default


#: Every job option's field, by name, in declaration order.
JOB_FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(JobOptions)}
#: The keys `mncloud.yaml` may set: every job option but the flag-only ones.
YAML_KEYS = tuple(name for name in JOB_FIELDS if meta(name).in_yaml)
#: Job options given on the command line each time (no `mncloud.yaml` key).
FLAG_ONLY = tuple(name for name in JOB_FIELDS if not meta(name).in_yaml)
