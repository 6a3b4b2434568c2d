"""JobSpec: the job the user asked for, validated once, and the words its options take.

Every layer (plan, render, backends, run records) takes a `JobSpec`; nothing downstream
re-parses flags (`mncloud.request` builds one from flags over the project's `mncloud.yaml`).
How a job is planned and run beside it is `launch.py` in this package (`LaunchOptions`);
`scriptargs.py` turns the script's arguments and `--resume-args` into the run script's words.
Validation errors are `SpecError`s whose message names the bad value and how to mend it.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from mncloud import constants, layout
from mncloud.constants import min_replicas as min_replicas  # re-exported: its old home
from mncloud.errors import SpecError
from mncloud.errors import first_error as first_error  # re-exported: its old home
from mncloud.export import ExportFormat
from mncloud.options import (  # re-exported: their old home; stated once, in mncloud.options
    DEFAULT_CKPT_SECONDS as DEFAULT_CKPT_SECONDS,
)
from mncloud.options import DEFAULT_HOURS as DEFAULT_HOURS
from mncloud.options import DEFAULT_IDLE_MINUTES as DEFAULT_IDLE_MINUTES
from mncloud.options import DEFAULT_RECOVERY_MINUTES as DEFAULT_RECOVERY_MINUTES
from mncloud.options import MAX_HOURS as MAX_HOURS
from mncloud.options import MAX_NODES as MAX_NODES
from mncloud.options import MAX_USD as MAX_USD
from mncloud.options import MIN_NODES as MIN_NODES
from mncloud.options import job_default, meta
from mncloud.storage.url import BucketURL

#: Clouds a request may name: SkyPilot's registry names plus our own local backend.
LOCAL_CLOUD = "local"

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REGION = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_]*$")


class Choice(str, Enum):
    """An option whose value is one of a few words: read case-insensitively and trimmed, so
    `--launcher TorchRun` (or `launcher: TorchRun` in mncloud.yaml) is `torchrun`."""

    @classmethod
    def _missing_(cls, value: object) -> Choice | None:
        if isinstance(value, str):
            text = value.strip().lower()
            for member in cls:
                if member.value == text:
                    return member
        return None

    @classmethod
    def read(cls, value: object, flag: str) -> Any:
        """The member a flag or mncloud.yaml names; a SpecError naming the choices if none."""
        try:
            return cls(getattr(value, "value", value))
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise SpecError(f"{flag} {value!r} is unknown; choose one of: {names}") from None


class SpotPolicy(Choice):
    """Which pricing the planner may choose: the one place spot-or-not is mapped."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    EITHER = "either"

    @classmethod
    def from_flag(cls, value: bool | None) -> SpotPolicy:
        """`--spot` (True), `--on-demand` (False) or neither (None, the plan decides)."""
        return cls.EITHER if value is None else cls.SPOT if value else cls.ON_DEMAND

    @property
    def use_spot(self) -> bool | None:
        """The market as a catalog filter: True spot only, False on-demand only, None either."""
        return {SpotPolicy.SPOT: True, SpotPolicy.ON_DEMAND: False}.get(self)


class Minimize(Choice):
    """What the plan ranks by (SkyPilot's words): expected cost, or expected time to finish."""

    COST = "cost"
    TIME = "time"


class Launcher(Choice):
    """What starts the script on every node (`--launcher`)."""

    TORCHRUN = "torchrun"
    ACCELERATE = "accelerate"
    DEEPSPEED = "deepspeed"
    NONE = "none"
    """The script itself on every node, with MASTER_ADDR, NODE_RANK, … exported."""

    @classmethod
    def parse(cls, value: object) -> Launcher:
        return cls.read(value, "--launcher")


class Recovery(Choice):
    """What a preemption of one node costs the run (`--recovery`)."""

    GANG = "gang"
    """Every node is relaunched; training resumes from the bucket's newest checkpoint."""
    NODE = "node"
    """Only the lost node is replaced; the others keep training and it heals from a live one
    (the script uses `mncloud.train.Replicas`)."""


class Tracker(Choice):
    """`--tracker`: whether mncloud keeps one experiment-tracker run per training run."""

    AUTO = "auto"
    """Every attempt logs into one W&B / MLflow / TensorBoard run (`render/trackers.py`)."""
    NONE = "none"
    """No tracker variable, no tracker run: the script's trackers as it set them."""


class NetworkTier(Choice):
    """Whether a multi-node task asks for each offer's fast fabric (`--network`)."""

    BEST = "best"
    """`network_tier: best` on every offer whose fabric needs it (EFA, GPUDirect-TCPX, IB)."""
    STANDARD = "standard"
    """The clouds' ordinary network: NCCL over TCP sockets."""


class Parallel(str, Enum):
    """How the model is spread over the GPUs (`--parallel`)."""

    DDP = "ddp"
    """A full replica on every GPU; gradients all-reduced once per step."""
    FSDP = "fsdp"
    """Parameters, gradients and optimizer state sharded over every GPU of the run (ZeRO-3)."""
    HSDP = "hsdp"
    """Sharded inside a node, replicated across nodes: only gradients cross the network."""


#: Where the bucket is mounted on a cloud node (`--mount-bucket`, `--ckpt-dir`).
BUCKET_MOUNT_PATH = "/mncloud-bucket"


class Accelerator(BaseModel):
    """What each node runs on: `H100:8` is eight H100s; `cpu:2` is two CPU processes."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Canonical name as SkyPilot spells it (`H100`, `A100-80GB`) or `cpu`."""
    count: int = Field(ge=1)
    """Devices per node; the number of torchrun processes per node."""

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"

    @classmethod
    def parse(cls, text: str) -> Accelerator:
        """Parse `NAME[:COUNT]`, check NAME against SkyPilot's accelerator list."""
        name, sep, count_text = text.strip().partition(":")
        if not name:
            raise SpecError(f"--gpus {text!r}: give NAME[:COUNT], e.g. H100:8 or cpu:2")
        count = 1
        if sep:
            try:
                count = int(count_text)
            except ValueError:
                raise SpecError(
                    f"--gpus {text!r}: the count {count_text!r} is not a whole number; "
                    "write e.g. H100:8"
                ) from None
        if count < 1:
            raise SpecError(f"--gpus {text!r}: the count must be at least 1, e.g. {name}:8")
        if name.lower() == "cpu":
            return cls(name="cpu", count=count)
        from mncloud import catalog

        return cls(name=catalog.canonical_accelerator(name), count=count)

    @classmethod
    def parse_list(cls, text: str) -> list[Accelerator]:
        """Parse `--gpus H100:8,A100-80GB:8`: the GPU types to rank, first one first."""
        items = [item.strip() for item in text.split(",")]
        if len(items) > 1:
            for n, item in enumerate(items, 1):
                if not item:
                    raise SpecError(
                        f"--gpus {text!r}: item {n} is empty; list GPU types with commas, e.g. "
                        "H100:8,A100-80GB:8"
                    )
        parsed = [cls.parse(item) for item in items]
        if len(parsed) > 1 and any(a.is_cpu for a in parsed):
            raise SpecError(f"--gpus {text!r}: cpu:N runs locally and takes no alternatives")
        if len(set(parsed)) < len(parsed):
            raise SpecError(f"--gpus {text!r}: a GPU type is listed twice; list each once")
        return parsed


def checked_nodes(value: object) -> int:
    """`--nodes` (or mncloud.yaml's `nodes`): a whole number from MIN_NODES to MAX_NODES, the one
    check of a node count (`NodeCount`, the type of every model's `nodes`)."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or not MIN_NODES <= value <= MAX_NODES:  # type: ignore[operator]
        raise SpecError(
            f"--nodes {value!r}: give a whole number of nodes from {MIN_NODES} to {MAX_NODES}"
        )
    return value  # type: ignore[return-value]


def min_nodes_error(value: object, nodes: int) -> str:
    """The one message for a bad `--min-nodes` (0, negative, not whole, above `--nodes`)."""
    return (
        f"--min-nodes {value!r}: give a whole number of nodes from {MIN_NODES} to --nodes "
        f"({nodes}), the fewest an elastic spot run may train on"
    )


def _node_count(value: object) -> int:
    try:
        return checked_nodes(value)
    except SpecError as err:
        raise ValueError(str(err)) from None


#: A node count, wherever one is a field (`JobSpec.nodes`, `PlanRequest.nodes`): its bounds
#: are this metadata, checked by `checked_nodes`.
NodeCount = Annotated[int, Field(**meta("nodes").bounds()), BeforeValidator(_node_count)]
#: Numbers are finite everywhere: `nan` and `inf` are refused, never compared.
NUMBERS = ConfigDict(frozen=True, allow_inf_nan=False)


class JobSpec(BaseModel):
    """One validated training request; the input of plan, render and every backend."""

    model_config = NUMBERS

    script: Path
    """The training script, absolute."""
    script_args: list[str] = Field(default_factory=list)
    """Arguments passed to the script verbatim."""
    workdir: Path
    """The script's project folder, synced to every node; the script path is relative to it."""
    name: str
    """Run name: DNS-safe, also the SkyPilot cluster / managed-job name."""
    accelerator: Accelerator
    gpu_alternatives: list[Accelerator] = Field(default_factory=list)
    """Other GPU types a plan may choose instead (`--gpus H100:8,A100-80GB:8`): ranked by
    expected cost to finish, rendered as `ordered` entries."""
    nodes: NodeCount = job_default("nodes")
    min_nodes: NodeCount | None = None
    """`--min-nodes`: an elastic spot run trains on as few as this many nodes while capacity
    gives fewer than `nodes`, and grows back at the next checkpoint; None: the gang waits."""
    spot: SpotPolicy = SpotPolicy.EITHER
    clouds: list[str] = Field(default_factory=list)
    """Allowed clouds (lower case); empty means any enabled cloud."""
    regions: list[str] = Field(default_factory=list)
    bucket: BucketURL | None = None
    mount_bucket: bool = False
    """Also mount the bucket with MOUNT_CACHED (checkpoints still upload directly)."""
    envs: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    """Names of secret env vars; values are read at launch and never rendered."""
    setup: str | None = None
    """A user setup command (shell), run once per node before training."""
    requirements: Path | None = None
    """A requirements file, relative to workdir, pip-installed in setup."""
    disk_size: int | None = Field(None, **meta("disk_size").bounds())
    image: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    max_hourly: float | None = Field(None, **meta("max_hourly").bounds())
    """Budget: the most the whole job may cost per hour, in USD."""
    max_restarts: int = Field(job_default("max_restarts"), **meta("max_restarts").bounds())
    """Retries after errors in the user's code, on every backend: SkyPilot's
    `max_restarts_on_errors`, the local supervisor's error budget. Preemptions are always
    recovered and never count against it."""
    master_port: int | None = Field(None, **meta("master_port").bounds())
    """Rendezvous port on the head node; None: 29500 on clouds, a free port for a local run
    (chosen at launch, so local runs side by side never collide)."""
    nccl_debug: str | None = None
    nccl_socket_ifname: str | None = None
    network: NetworkTier = NetworkTier(job_default("network"))
    """Multi-node tasks: ask for each offer's fast fabric (best) or not (standard); one node
    and local runs are never changed."""
    min_bandwidth: float | None = Field(None, allow_inf_nan=False, **meta("min_bandwidth").bounds())
    """GB/s: the preflight's all-reduce bus bandwidth below this refuses to train (else the
    shortfall against the plan's expectation only warns)."""
    require_paths: list[str] = Field(default_factory=list)
    """Paths (local or bucket URLs) every node must see before training starts."""
    preflight: bool = job_default("preflight")
    """Run `python -m mncloud.doctor node` on every node before torchrun (when installed)."""
    launcher: Launcher = Launcher(job_default("launcher"))
    """What starts the script on every node: torchrun, accelerate, deepspeed or none."""
    ckpt_dir: str | None = None
    """An absolute path on every node backed by `<ckpt uri>/ckpt-dir` (`MNCLOUD_CKPT_DIR`)."""
    resume_args: list[str] = Field(default_factory=list)
    """`--resume-args`, split into words: added to `script_args` on a node that starts with a
    committed unit in `ckpt_dir`, `{ckpt}` its path there (`render/scriptargs.py`)."""
    recovery: Recovery = Recovery.GANG
    """Gang (relaunch every node) or node (replace the lost node only)."""
    parallel: Parallel | None = None
    """`--parallel`: ddp, fsdp or hsdp, reaching the script as `$MNCLOUD_PARALLEL`
    (`mncloud.train.parallelize`); None: the script's own choice."""
    tracker: Tracker = Tracker(job_default("tracker"))
    """Whether every attempt logs into one tracker run (`render/trackers.py`)."""
    export_on_finish: ExportFormat | None = None
    """`up --export-on-finish`: once the run succeeds, node 0 exports the model of the last
    checkpoint into `<ckpt uri>/export` (`mncloud export`)."""

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(
                f"--name {value!r}: use lower-case letters, digits and '-', starting with a "
                "letter, at most 63 characters"
            )
        return value

    @field_validator("clouds")
    @classmethod
    def _known_clouds(cls, values: list[str]) -> list[str]:
        return [canonical_cloud(v) for v in values]

    @field_validator("regions")
    @classmethod
    def _regions(cls, values: list[str]) -> list[str]:
        for value in values:
            if not _REGION.match(value):
                raise ValueError(f"--region {value!r} is not a region name, e.g. us-east-1")
        return values

    @field_validator("envs")
    @classmethod
    def _env_names(cls, values: dict[str, str]) -> dict[str, str]:
        for key in values:
            _check_env_name(key, "--env")
        return values

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, values: list[str]) -> list[str]:
        for key in values:
            _check_env_name(key, "--secret")
        return values

    @model_validator(mode="after")
    def _min_nodes_at_most_nodes(self) -> JobSpec:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(min_nodes_error(self.min_nodes, self.nodes))
        return self

    @model_validator(mode="after")
    def _alternatives_are_for_clouds(self) -> JobSpec:
        if self.gpu_alternatives and self.clouds == [LOCAL_CLOUD]:
            raise ValueError(
                "--gpus with several GPU types is for clouds, where the plan picks one; a local "
                "run takes one type (--gpus cpu:N)"
            )
        return self

    def updated(self, **changes: Any) -> JobSpec:
        """A copy with `changes`, validated as any spec is (`model_copy(update=…)` skips it)."""
        return type(self).model_validate({**self.model_dump(), **changes})

    @property
    def is_local(self) -> bool:
        return self.clouds == [LOCAL_CLOUD]

    @property
    def script_relpath(self) -> str:
        """The script's path relative to workdir, as it is run on every node."""
        return self.script.relative_to(self.workdir).as_posix()

    @property
    def ckpt_uri(self) -> str | None:
        """`<bucket>/<name>` (MNCLOUD_CKPT_URI), or None without --bucket."""
        return layout.ckpt_uri(self.bucket, self.name) if self.bucket else None

    @property
    def rendezvous_port(self) -> int:
        """The port torchrun meets on: `--master-port`, else the default."""
        return self.master_port or constants.DEFAULT_MASTER_PORT

    @property
    def procs_per_node(self) -> int:
        return self.accelerator.count


def _check_env_name(key: str, flag: str) -> None:
    if not _ENV_NAME.match(key):
        raise ValueError(f"{flag} {key!r}: a variable name is letters, digits and '_'")
    if key.startswith(("SKYPILOT_", "MNCLOUD_")):
        raise ValueError(f"{flag} {key!r}: SKYPILOT_* and MNCLOUD_* names are set by mncloud")


def canonical_cloud(value: str) -> str:
    """Lower-case a cloud name and check SkyPilot knows it (or it is `local`)."""
    name = value.strip().lower()
    if name == LOCAL_CLOUD:
        return name
    from mncloud.catalog.index import cloud_names  # SkyPilot's registry, cached

    known = cloud_names()
    if name not in known:
        raise ValueError(f"--cloud {value!r} is unknown; choose one of: local, {', '.join(known)}")
    return name


def default_of(field: str) -> Any:
    """The default a `JobSpec` field declares: the one statement of a job option's default,
    which the CLI's help and `mncloud.yaml`'s absent keys both come to."""
    return JobSpec.model_fields[field].get_default(call_default_factory=True)
