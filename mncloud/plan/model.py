"""The plan's vocabulary: what to plan (`PlanRequest`), each priced offer (`Candidate`), the
ranked result (`Plan`). `make_plan` (the package) fills them; explain and timing read them."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mncloud.catalog import Exclusion
from mncloud.errors import SpecError, first_error
from mncloud.plan.costmodel import (
    DEFAULT_CKPT_SECONDS,
    DEFAULT_HEAL_MINUTES,
    DEFAULT_RECOVERY_MINUTES,
    Estimate,
    LearnedHazard,
    spot_hazard_at,
)
from mncloud.plan.hazards import Evidence, TraceHazard
from mncloud.plan.stepmodel import Bound, Workload
from mncloud.spec import (
    DEFAULT_HOURS,
    LOCAL_CLOUD,
    Accelerator,
    JobSpec,
    Minimize,
    NetworkTier,
    NodeCount,
    Parallel,
    Recovery,
    SpotPolicy,
    canonical_cloud,
    default_of,
)
from mncloud.spec.launch import PlanOptions

#: How many fallbacks a plan hands SkyPilot after its choice, and at most how many entries
#: (choice included) may come from one cloud before other clouds get a turn.
MAX_FALLBACKS = 4


class PlanRequest(BaseModel):
    """What to plan: the hardware, how long, which markets and clouds, budgets, model inputs."""

    model_config = ConfigDict(frozen=True)

    accelerator: Accelerator
    alternatives: list[Accelerator] = Field(default_factory=list)
    """Other GPU types to rank beside `accelerator` (`--gpus H100:8,A100-80GB:8`)."""
    nodes: NodeCount = default_of("nodes")
    spot: SpotPolicy = default_of("spot")
    clouds: list[str] = Field(default_factory=list)
    """Allowed clouds (SkyPilot names); empty: `catalog.default_clouds()`."""
    regions: list[str] = Field(default_factory=list)
    hours: float = Field(DEFAULT_HOURS, gt=0)
    """Hours of work the job needs without interruptions (W), on the fastest offer of
    `accelerator` when there is a `workload` (other offers scale by their step time)."""
    steps: int | None = Field(None, ge=1)
    """Optimizer steps to finish (`--steps`): with a `workload`, each offer's W is steps ×
    its step time, and `hours` is not used."""
    workload: Workload | None = None
    """What one rank's step costs (a profile, or flags): the step-time model's input."""
    workload_source: str = ""
    """Where `workload` came from, for the plan's explanation."""
    minimize: Minimize = Minimize.COST
    network: NetworkTier = NetworkTier.BEST
    """`--network`: best prices each multi-node offer at its fabric's rate (render enables it),
    standard at its ordinary network's."""
    parallel: Parallel | None = None
    """`plan --parallel`: how the model is spread over the GPUs; None (auto): DDP when a
    replica fits, HSDP when the state sharded over a node fits, FSDP otherwise."""
    measured_busbw: dict[str, float] = Field(default_factory=dict)
    """`cloud/instance_type` → inter-node bus bandwidth per node (GB/s) that earlier runs'
    preflights measured (`--learn`), as at `learned.REFERENCE_NODES` nodes (rescaled to the
    plan's node count by the fabric's efficiency there): replaces the data file's figure."""
    max_hourly: float | None = Field(None, gt=0)
    """Budget: the most the whole job may cost per hour, USD."""
    max_cost: float | None = Field(None, gt=0)
    """Budget: the most the whole job may be expected to cost, USD."""
    preemption_rate: float | None = Field(None, ge=0)
    """Spot hazard per node per hour for every cloud (`--preemption-rate`): wins over the rest."""
    hazards: dict[str, float] = Field(default_factory=dict)
    """Spot hazard per node per hour by cloud, overriding the measured (filled from `learned`)."""
    learned: list[LearnedHazard] = Field(default_factory=list)
    """How `hazards` were learned from run records (`--learn`), for --verbose and the record."""
    traces: list[TraceHazard] = Field(default_factory=list)
    """The user's own spot traces, measured (`--hazards-from`): win over learned and measured."""
    recovery_minutes: float = Field(DEFAULT_RECOVERY_MINUTES, ge=0)
    """R: minutes from a preemption to training again, work lost since the checkpoint aside."""
    ckpt_seconds: float = Field(DEFAULT_CKPT_SECONDS, ge=0)
    """C: seconds training stalls to write one checkpoint."""
    recovery: Recovery = default_of("recovery")
    """How the run recovers from a preemption (`JobSpec.recovery`): what the plan prices."""
    heal_minutes: float = Field(DEFAULT_HEAL_MINUTES, ge=0)
    """H: minutes every node waits while a replacement heals from a peer (node recovery)."""

    @model_validator(mode="after")
    def _node_needs_peers(self) -> PlanRequest:
        if self.recovery is Recovery.NODE and self.nodes < 2:
            raise ValueError("--recovery node needs --nodes 2 or more: one node has no peer to "
                             "heal from; use --recovery gang")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _steps_need_workload(self) -> PlanRequest:
        if self.steps is not None and self.workload is None:
            raise ValueError(
                "--steps needs the step's cost: profile the script (`mncloud profile SCRIPT`) "
                "or give --flops-per-step (or --params and --tokens-per-step)"
            )
        return self

    @model_validator(mode="after")
    def _nodes_need_gradients(self) -> PlanRequest:
        w = self.workload
        if self.nodes > 1 and w is not None and not (w.grad_bytes or w.param_count):
            raise ValueError(
                f"--nodes {self.nodes}: the step's communication is unknown: give --params "
                "(or --grad-bytes) with --flops-per-step, or profile the script"
            )
        return self

    @property
    def accelerators(self) -> list[Accelerator]:
        """Every GPU type to rank, the first one first."""
        return list(dict.fromkeys([self.accelerator, *self.alternatives]))

    @property
    def work(self) -> str:
        """The amount of work, in words: `5,000 steps` or `24 h of work`."""
        if self.steps is not None:
            return f"{self.steps:,} steps"
        return f"{self.hours:g} h of work"

    @property
    def gpus_text(self) -> str:
        return " or ".join(str(a) for a in self.accelerators)

    @property
    def other_recovery(self) -> Recovery:
        """The recovery mode this request does not price its choice under."""
        return Recovery.GANG if self.recovery is Recovery.NODE else Recovery.NODE

    @field_validator("accelerator", "alternatives")
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        if any(a.is_cpu for a in (value if isinstance(value, list) else [value])):
            raise ValueError("--gpus cpu:N runs on this machine (--cloud local); nothing to plan")
        return value

    @field_validator("hazards")
    @classmethod
    def _hazards(cls, values: dict[str, float]) -> dict[str, float]:
        if any(v < 0 for v in values.values()):
            raise ValueError("a spot hazard cannot be negative")
        return {k.lower(): v for k, v in values.items()}

    @model_validator(mode="after")
    def _learned_hazards(self) -> PlanRequest:
        for item in self.learned:  # an explicit `hazards` entry wins over a learned one
            self.hazards.setdefault(item.cloud, item.hazard)
        return self

    def spot_hazard(self, cloud: str, region: str | None = None) -> float:
        """The spot hazard per node-hour the plan assumes at a place."""
        return self.spot_hazard_at(cloud, region)[0]

    def spot_hazard_at(self, cloud: str, region: str | None) -> tuple[float, str]:
        """(hazard, where it came from) at a place: `costmodel.spot_hazard_at`'s precedence."""
        return spot_hazard_at(
            cloud,
            region,
            preemption_rate=self.preemption_rate,
            evidence=Evidence.of(self.traces, "your traces") if self.traces else None,
            per_cloud=self.hazards,
            learned=frozenset(item.cloud for item in self.learned),
        )

    @field_validator("clouds")
    @classmethod
    def _clouds(cls, values: list[str]) -> list[str]:
        names = [canonical_cloud(v) for v in values]
        if LOCAL_CLOUD in names:
            raise ValueError("--cloud local runs on this machine; there is nothing to plan")
        return list(dict.fromkeys(names))

    @classmethod
    def build(cls, **fields: Any) -> PlanRequest:
        """Validate like the constructor, but raise SpecError with a one-line message."""
        try:
            return cls(**fields)
        except ValidationError as err:
            raise SpecError(first_error(err)) from None

    @classmethod
    def from_spec(
        cls, spec: JobSpec, options: PlanOptions | None = None, inputs: ModelInputs | None = None
    ) -> PlanRequest:
        """The plan request for a JobSpec: its market, the planner's options and what they
        point at (`inputs`), field by field."""
        return cls.for_market(
            spec.accelerator,
            list(spec.gpu_alternatives),
            nodes=spec.nodes,
            spot=spec.spot,
            clouds=list(spec.clouds),
            regions=list(spec.regions),
            max_hourly=spec.max_hourly,
            recovery=spec.recovery,
            network=spec.network,
            parallel=spec.parallel,
            options=options,
            inputs=inputs,
        )

    @classmethod
    def for_market(
        cls,
        accelerator: Accelerator,
        alternatives: list[Accelerator],
        *,
        nodes: int,
        spot: SpotPolicy,
        clouds: list[str],
        regions: list[str],
        max_hourly: float | None,
        recovery: Recovery,
        network: NetworkTier,
        parallel: Parallel | None = None,
        options: PlanOptions | None = None,
        inputs: ModelInputs | None = None,
    ) -> PlanRequest:
        """The plan request for a market (`plan` without a script names one by flags), the
        planner's options and their inputs; a SpecError with a one-line message."""
        options = options or PlanOptions()
        inputs = inputs or ModelInputs()
        try:
            return cls(
                accelerator=accelerator,
                alternatives=alternatives,
                nodes=nodes,
                spot=spot,
                clouds=clouds,
                regions=regions,
                max_hourly=max_hourly,
                recovery=recovery,
                network=network,
                parallel=parallel,
                hours=options.hours,
                steps=options.steps,
                minimize=options.minimize,
                max_cost=options.max_cost,
                preemption_rate=options.preemption_rate,
                recovery_minutes=_or(options.recovery_minutes, DEFAULT_RECOVERY_MINUTES),
                ckpt_seconds=_or(options.ckpt_seconds, DEFAULT_CKPT_SECONDS),
                workload=inputs.workload,
                workload_source=inputs.workload_source,
                measured_busbw=inputs.measured_busbw,
                learned=inputs.learned,
                traces=inputs.traces,
            )
        except ValidationError as err:
            raise SpecError(first_error(err)) from None


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


class ModelInputs(BaseModel):
    """What the planner's options point at, read (`launch.model_inputs`): the step's cost (a
    profile, or flags), hazards and bandwidths learned from run records, the user's traces."""

    model_config = ConfigDict(frozen=True)

    workload: Workload | None = None
    workload_source: str = ""
    learned: list[LearnedHazard] = Field(default_factory=list)
    measured_busbw: dict[str, float] = Field(default_factory=dict)
    traces: list[TraceHazard] = Field(default_factory=list)


class Candidate(BaseModel):
    """One offer with its expected outcome for the whole job (under `recovery`)."""

    model_config = ConfigDict(frozen=True)

    cloud: str
    region: str
    instance_type: str
    accelerator: str
    """Per node, e.g. `H100:8`."""
    spot: bool
    hourly_per_node: float
    hourly_total: float
    expected_hours: float
    expected_cost: float
    expected_preemptions: float
    checkpoint_interval_s: float
    preemption_rate: float
    """Hazard per node per hour that the estimate assumed."""
    hazard_source: str = ""
    """Where `preemption_rate` came from (traces, your traces, learned, the flag, default)."""
    recovery: Recovery = Recovery.GANG
    """The recovery mode the expected figures above assume: the request's."""
    by_recovery: dict[Recovery, Estimate] = Field(default_factory=dict)
    """The outcome under each mode: gang always, node on 2+ nodes (`plan --verbose`)."""
    step_seconds: float | None = None
    """One optimizer step here (None: no workload, every offer assumed equally fast)."""
    compute_seconds: float | None = None
    comm_seconds: float | None = None
    """The gradient all-reduce, before the part the backward pass hides."""
    exposed_comm_seconds: float | None = None
    bound: Bound | None = None
    work_hours: float = 0.0
    """W: hours of work here without interruptions (`expected_hours` adds the losses)."""
    network: str = ""
    """The inter-node network the step-time model assumed (multi-node offers)."""
    parallel: Parallel | None = None
    """How the step-time model spread the model over the GPUs (None: no workload)."""
    parallel_why: str = ""
    recompute: str | None = None
    memory_per_gpu_gib: float | None = None
    mfu: float | None = None
    """The efficiency the step assumed, and where it came from (`mfu_source`)."""
    mfu_source: str = ""
    region_rank: int = Field(0, exclude=True)
    """SkyPilot's preference among this instance type's regions: breaks price ties."""

    @property
    def market(self) -> str:
        return "spot" if self.spot else "on-demand"

    @property
    def where(self) -> str:
        return f"{self.cloud} {self.instance_type} in {self.region}"

    def resource(self) -> dict[str, Any]:
        """This candidate as one SkyPilot `resources.ordered` entry."""
        return {
            "infra": f"{self.cloud}/{self.region}",
            "instance_type": self.instance_type,
            "accelerators": self.accelerator,
            "use_spot": self.spot,
        }


class Plan(BaseModel):
    """The ranked candidates, the choice, its fallbacks and why the choice won."""

    request: PlanRequest
    choice: Candidate
    fallbacks: list[Candidate]
    """Tried in order after the choice: same market, spread over regions and clouds."""
    candidates: list[Candidate]
    """Every fitting offer within budget, cheapest expected cost first."""
    checkpoint_interval_s: float
    """The choice's checkpoint interval."""
    other_choice: Candidate | None = None
    """What the other recovery mode would choose on 2+ nodes (its figures: `by_recovery`);
    None on one node or where that mode finds no offer within budget."""
    excluded: list[Exclusion] = Field(default_factory=list)
    explanation: str

    def ordered_resources(self) -> list[dict[str, Any]]:
        """SkyPilot `resources.ordered` entries: the choice, then the fallbacks.

        Every entry shares the choice's market (the plan priced that market), so one list
        never mixes the two. `job_recovery` belongs on the
        parent `resources` (SkyPilot requires it to be the same for every entry).
        """
        return [c.resource() for c in (self.choice, *self.fallbacks)]

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        """The plan as JSON-ready data; `top` limits the candidates listed."""
        data = self.model_dump(mode="json")
        if top is not None:
            data["candidates"] = data["candidates"][:top]
        return data
