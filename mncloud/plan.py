"""Cost-aware planning: put the job where it costs least *to finish*, not where $/h is lowest.

SkyPilot's optimizer ranks offers by their hourly sticker price. A spot offer at a third of the
price may still lose: every preemption of any node stops the whole gang, costs a relaunch and
throws away the work since the last checkpoint, and checkpoints themselves take time. This
module prices that in. The cost model is a handful of pure functions (hours in, hours out); the
planner feeds them SkyPilot's catalog offers (`catalog.offers`) and ranks by expected cost.

The model (first order, after Young 1974 and Daly 2006)
-------------------------------------------------------
N nodes, each preempted at hazard λ per hour, independently, so the gang is interrupted at
Λ = N·λ. The job needs W hours of work. It writes a checkpoint of cost C hours every τ hours of
work; a preemption costs R hours (detect, relaunch, setup, load) plus the work since the last
checkpoint, τ/2 on average. Per hour of work the expected overhead is therefore

    overhead(τ) = C/τ + Λ·(R + τ/2)

minimised at Young's interval τ* = √(2·C/Λ) (Daly's √(2·C·M) with M = 1/Λ the mean time between
preemptions), which we clamp to [max(5 min, C), max(2 h, C)]: shorter intervals spend too much
on checkpoints whatever the hazard, and even an on-demand job should not risk hours of work on a
hardware fault. Then

    expected hours        T = W · (1 + overhead(τ))
    expected preemptions  Λ·T
    expected cost         hourly_total · T        (nodes are paid through recovery, too)

The first-order form holds while the losses are small; once Λ·(R + τ/2) reaches
`MAX_LOSS_FRACTION` the job would spend most of its time recovering, and the offer is left out.
On-demand uses the same formulae with a small hardware-fault hazard, so its checkpoints cost
something too. Independent node hazards make N·λ pessimistic when a cloud reclaims several of
your nodes at once (one event, not N).

Learning the hazard (`--learn`, `learn_hazards`)
-----------------------------------------------
The spot priors below are guesses; your own run records count preemptions per spot node-hour
by cloud (`runs.observed_spot_hazard`). Little data must not swing the plan, so the observed
rate is blended with the prior as if the prior had been seen for `LEARN_PRIOR_NODE_HOURS`
node-hours (the posterior mean of a Poisson rate under a gamma prior):

    λ = (preemptions + λ_prior · H₀) / (node_hours + H₀)

e.g. with λ_prior = 0.05/h and H₀ = 50: 1 preemption in 4 node-hours gives 0.065 (not 0.25);
30 in 200 node-hours gives 0.13; the observation's weight is node_hours / (node_hours + H₀).
An explicit `--preemption-rate` still wins for every cloud.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mncloud.catalog import Exclusion, Offer
from mncloud.errors import CatalogError, SpecError
from mncloud.spec import (
    DEFAULT_HOURS,
    LOCAL_CLOUD,
    MAX_NODES,
    Accelerator,
    JobSpec,
    SpotPolicy,
    canonical_cloud,
)

#: Default spot preemption hazard λ per node per hour, by SkyPilot cloud name. These are
#: planning priors, not measurements of your region: no cloud publishes an hourly rate for its
#: GPU spot capacity, and observed rates swing by an order of magnitude between instance types,
#: regions and weeks. Pass --preemption-rate when you know better.
#: - aws: the Spot Instance Advisor publishes only monthly "frequency of interruption" bands
#:   (<5%, 5-10%, 10-15%, 15-20%, >20% of instances reclaimed in the trailing month); 8-GPU
#:   types (p4d, p5) usually sit in the open-ended top band, >20%/month ≈ >3e-4/h, a bound that
#:   users of multi-day GPU jobs find far too low. 0.05/h (one preemption per ~20 node-hours)
#:   is our deliberately cautious guess.
#: - gcp: the Spot VM documentation gives no rate ("generally low, but might vary from day to
#:   day and from zone to zone"); its predecessor, preemptible VMs, were stopped after at most
#:   24 h (≥ 1/24 ≈ 0.042/h). We take that scale: 0.05/h.
#: - azure: the portal shows eviction-rate bands per VM size, like AWS; same guess, 0.05/h.
SPOT_HAZARD_PER_HOUR: dict[str, float] = {"aws": 0.05, "gcp": 0.05, "azure": 0.05}
#: Spot hazard for clouds not listed above (RunPod interruptible pods, bid markets such as
#: Vast): nothing published, and pods can be taken without notice, so twice the big clouds'.
DEFAULT_SPOT_HAZARD_PER_HOUR = 0.1
#: On-demand nodes fail too. Meta's "The Llama 3 Herd of Models" (2024, §3.3.4) reports 419
#: unexpected interruptions in 54 days of pre-training on 16,384 H100s (2,048 hosts of 8):
#: 419 / (54·24 h · 2,048) ≈ 1.6e-4 per node-hour. Well-run private clusters, not clouds, but
#: the best public figure at that scale.
ON_DEMAND_HAZARD_PER_HOUR = 1.6e-4
#: R: detect the preemption, provision a new cluster (minutes for 8-GPU VMs), run setup and load
#: the checkpoint. SkyPilot's managed-job recovery usually takes several minutes; 10 is a guess.
DEFAULT_RECOVERY_MINUTES = 10.0
#: C: time the training loop stalls to write one checkpoint (async uploads keep it short).
DEFAULT_CKPT_SECONDS = 60.0
#: Bounds of the checkpoint interval, in seconds (see the module docstring).
MIN_INTERVAL_S = 300.0
MAX_INTERVAL_S = 7200.0
#: Above this expected fraction of time lost to preemptions the first-order model no longer
#: holds and the job mostly recovers instead of training: such offers are left out.
MAX_LOSS_FRACTION = 0.5
#: How many fallbacks a plan hands SkyPilot after its choice, and at most how many entries
#: (choice included) may come from one cloud before other clouds get a turn.
MAX_FALLBACKS = 4
_PER_CLOUD = 2
#: H₀: how many node-hours of observation the prior is worth when `--learn` blends them.
LEARN_PRIOR_NODE_HOURS = 50.0


# --- the cost model: pure functions, times in hours -------------------------------------------


def spot_hazard(cloud: str) -> float:
    """Default spot preemption hazard per node per hour for a SkyPilot cloud name."""
    return SPOT_HAZARD_PER_HOUR.get(cloud.lower(), DEFAULT_SPOT_HAZARD_PER_HOUR)


def blend_hazard(
    prior: float,
    preemptions: int,
    node_hours: float,
    prior_node_hours: float = LEARN_PRIOR_NODE_HOURS,
) -> float:
    """Observed preemptions blended with the prior: (n + λ₀·H₀) / (h + H₀) (module docstring)."""
    if node_hours <= 0 and prior_node_hours <= 0:
        return prior
    return (preemptions + prior * prior_node_hours) / (node_hours + prior_node_hours)


class LearnedHazard(BaseModel):
    """One cloud's spot hazard learned from run records (`--learn`)."""

    model_config = ConfigDict(frozen=True)

    cloud: str
    prior: float
    """The planning prior, `spot_hazard(cloud)`."""
    preemptions: int
    node_hours: float
    """Observed spot node-hours."""
    observed: float
    """preemptions / node_hours."""
    weight: float
    """Weight of the observation: node_hours / (node_hours + H₀)."""
    hazard: float
    """The blend the planner uses, per node per hour."""


def learn_hazards(
    observed: Mapping[str, tuple[float, int, float]],
    prior_node_hours: float = LEARN_PRIOR_NODE_HOURS,
) -> list[LearnedHazard]:
    """Blend `runs.observed_spot_hazard()` (`cloud → (hazard, count, node_hours)`) with the priors.

    This machine's simulated nodes (`local`) teach nothing about a cloud and are skipped.
    """
    learned = []
    for name, (_rate, count, hours) in sorted(observed.items()):
        cloud = name.lower()
        if cloud == LOCAL_CLOUD or hours <= 0:
            continue
        prior = spot_hazard(cloud)
        learned.append(
            LearnedHazard(
                cloud=cloud,
                prior=prior,
                preemptions=int(count),
                node_hours=hours,
                observed=count / hours,
                weight=hours / (hours + prior_node_hours),
                hazard=blend_hazard(prior, int(count), hours, prior_node_hours),
            )
        )
    return learned


def interval_bounds(ckpt_hours: float) -> tuple[float, float]:
    """The clamp for τ in hours: [max(5 min, C), max(2 h, C)]."""
    lower = max(MIN_INTERVAL_S / 3600, ckpt_hours)
    return lower, max(MAX_INTERVAL_S / 3600, lower)


def checkpoint_interval(ckpt_hours: float, job_hazard: float) -> float:
    """Young–Daly interval τ = √(2·C/Λ) in hours, clamped to `interval_bounds`.

    With Λ = 0 (or C = 0) the unclamped optimum is infinite (or zero); the clamp decides.
    """
    lower, upper = interval_bounds(ckpt_hours)
    if job_hazard <= 0:
        return upper
    return min(upper, max(lower, math.sqrt(2 * ckpt_hours / job_hazard)))


def overhead(interval: float, ckpt_hours: float, job_hazard: float, recovery_hours: float) -> float:
    """Expected extra wall time per hour of work: C/τ + Λ·(R + τ/2)."""
    return ckpt_hours / interval + loss_fraction(interval, job_hazard, recovery_hours)


def loss_fraction(interval: float, job_hazard: float, recovery_hours: float) -> float:
    """Expected time lost to preemptions per hour of work: Λ·(R + τ/2)."""
    return job_hazard * (recovery_hours + interval / 2)


class Estimate(BaseModel):
    """The expected outcome of running W hours of work on one offer."""

    model_config = ConfigDict(frozen=True)

    interval_hours: float
    """Checkpoint interval τ."""
    hours: float
    """Expected wall hours T."""
    preemptions: float
    """Expected number of gang interruptions, Λ·T."""
    cost: float
    """Expected USD, hourly_total · T."""
    loss_fraction: float
    """Λ·(R + τ/2): beyond `MAX_LOSS_FRACTION` the model (and the job) breaks down."""


def estimate(
    hourly_total: float,
    work_hours: float,
    nodes: int,
    hazard_per_node: float,
    recovery_hours: float,
    ckpt_hours: float,
) -> Estimate:
    """Expected interval, wall hours, preemptions and cost (see the module docstring)."""
    job_hazard = nodes * hazard_per_node
    tau = checkpoint_interval(ckpt_hours, job_hazard)
    hours = work_hours * (1 + overhead(tau, ckpt_hours, job_hazard, recovery_hours))
    return Estimate(
        interval_hours=tau,
        hours=hours,
        preemptions=job_hazard * hours,
        cost=hourly_total * hours,
        loss_fraction=loss_fraction(tau, job_hazard, recovery_hours),
    )


# --- the request and the plan ------------------------------------------------------------------


class PlanRequest(BaseModel):
    """What to plan: the hardware, how long, which markets and clouds, budgets, model inputs."""

    model_config = ConfigDict(frozen=True)

    accelerator: Accelerator
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    spot: SpotPolicy = SpotPolicy.EITHER
    clouds: list[str] = Field(default_factory=list)
    """Allowed clouds (SkyPilot names); empty: `catalog.default_clouds()`."""
    regions: list[str] = Field(default_factory=list)
    hours: float = Field(DEFAULT_HOURS, gt=0)
    """Hours of work the job needs without interruptions (W)."""
    max_hourly: float | None = Field(None, gt=0)
    """Budget: the most the whole job may cost per hour, USD."""
    max_cost: float | None = Field(None, gt=0)
    """Budget: the most the whole job may be expected to cost, USD."""
    preemption_rate: float | None = Field(None, ge=0)
    """Spot hazard per node per hour for every cloud; None: `hazards`, else `spot_hazard(cloud)`."""
    hazards: dict[str, float] = Field(default_factory=dict)
    """Spot hazard per node per hour by cloud, overriding the priors (filled from `learned`)."""
    learned: list[LearnedHazard] = Field(default_factory=list)
    """How `hazards` were learned from run records (`--learn`), for --verbose and the record."""
    recovery_minutes: float = Field(DEFAULT_RECOVERY_MINUTES, ge=0)
    """R: minutes from a preemption to training again, work lost since the checkpoint aside."""
    ckpt_seconds: float = Field(DEFAULT_CKPT_SECONDS, ge=0)
    """C: seconds training stalls to write one checkpoint."""

    @field_validator("accelerator")
    @classmethod
    def _gpu(cls, value: Accelerator) -> Accelerator:
        if value.is_cpu:
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

    def spot_hazard(self, cloud: str) -> float:
        """The spot hazard the plan assumes on `cloud`: --preemption-rate, learned, or prior."""
        if self.preemption_rate is not None:
            return self.preemption_rate
        return self.hazards.get(cloud.lower(), spot_hazard(cloud))

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
            first = err.errors()[0]
            message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            if not message.startswith("--"):
                where = ".".join(str(p) for p in first.get("loc", ()))
                message = f"--{where.replace('_', '-')}: {message}"
            raise SpecError(message) from None

    @classmethod
    def from_spec(
        cls, spec: JobSpec, *, hours: float = DEFAULT_HOURS, **overrides: Any
    ) -> PlanRequest:
        """The plan request for a JobSpec; `overrides` sets the fields a JobSpec lacks."""
        fields: dict[str, Any] = {
            "accelerator": spec.accelerator,
            "nodes": spec.nodes,
            "spot": spec.spot,
            "clouds": list(spec.clouds),
            "regions": list(spec.regions),
            "hours": hours,
            "max_hourly": spec.max_hourly,
        }
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls.build(**fields)


class Candidate(BaseModel):
    """One offer with its expected outcome for the whole job."""

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
    excluded: list[Exclusion] = Field(default_factory=list)
    explanation: str

    def ordered_resources(self) -> list[dict[str, Any]]:
        """SkyPilot `resources.ordered` entries: the choice, then the fallbacks.

        Every entry shares the choice's market: a managed spot job recovers, a plain on-demand
        cluster does not, so one list never mixes the two. `job_recovery` belongs on the
        parent `resources` (SkyPilot requires it to be the same for every entry).
        """
        return [c.resource() for c in (self.choice, *self.fallbacks)]

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        """The plan as JSON-ready data; `top` limits the candidates listed."""
        data = self.model_dump(mode="json")
        if top is not None:
            data["candidates"] = data["candidates"][:top]
        return data


def make_plan(request: PlanRequest, *, max_fallbacks: int = MAX_FALLBACKS) -> Plan:
    """Rank every offer SkyPilot's catalog has for the request by expected cost to finish.

    Raises CatalogError when no offer fits (with what is available) or all are over budget.
    """
    from mncloud import catalog

    use_spot = {SpotPolicy.SPOT: True, SpotPolicy.ON_DEMAND: False}.get(request.spot)
    search = catalog.offers(
        request.accelerator.name,
        request.accelerator.count,
        clouds=request.clouds,
        regions=request.regions,
        use_spot=use_spot,
        nodes=request.nodes,
    )
    excluded = list(search.excluded)
    candidates: list[Candidate] = []
    broken: dict[tuple[str, bool], Candidate] = {}
    for offer in search.offers:
        candidate, viable = _candidate(offer, request)
        if viable:
            candidates.append(candidate)
        else:
            key = (candidate.cloud, candidate.spot)
            if key not in broken or candidate.hourly_total < broken[key].hourly_total:
                broken[key] = candidate
    for (cloud, _spot), c in sorted(broken.items()):
        excluded.append(
            Exclusion(
                cloud=cloud,
                reason=f"{c.market}: at {c.preemption_rate:g} preemptions per node-hour × "
                f"{request.nodes} nodes the job would lose over {MAX_LOSS_FRACTION:.0%} of its "
                "time recovering; use fewer nodes or on-demand (or set --preemption-rate if "
                "you know the rate is lower)",
            )
        )
    if not candidates:
        raise CatalogError(
            f"no {request.accelerator} offer can finish: "
            + "; ".join(f"{e.cloud}: {e.reason}" for e in excluded)
        )
    candidates.sort(key=_rank)
    within = _within_budget(candidates, request, excluded)
    choice = within[0]
    return Plan(
        request=request,
        choice=choice,
        fallbacks=_fallbacks(within, max_fallbacks),
        candidates=within,
        checkpoint_interval_s=choice.checkpoint_interval_s,
        excluded=excluded,
        explanation=_explain(within, request, excluded),
    )


def _candidate(offer: Offer, request: PlanRequest) -> tuple[Candidate, bool]:
    hazard = request.spot_hazard(offer.cloud) if offer.spot else ON_DEMAND_HAZARD_PER_HOUR
    hourly_total = offer.hourly_price * request.nodes
    est = estimate(
        hourly_total,
        request.hours,
        request.nodes,
        hazard,
        request.recovery_minutes / 60,
        request.ckpt_seconds / 3600,
    )
    candidate = Candidate(
        cloud=offer.cloud,
        region=offer.region,
        instance_type=offer.instance_type,
        accelerator=f"{offer.accelerator}:{offer.accelerator_count}",
        spot=offer.spot,
        hourly_per_node=offer.hourly_price,
        hourly_total=hourly_total,
        expected_hours=est.hours,
        expected_cost=est.cost,
        expected_preemptions=est.preemptions,
        checkpoint_interval_s=est.interval_hours * 3600,
        preemption_rate=hazard,
        region_rank=offer.region_rank,
    )
    return candidate, est.loss_fraction < MAX_LOSS_FRACTION


def _rank(c: Candidate) -> tuple[float, float, str, int, str]:
    """Expected cost, then the sticker, then SkyPilot's own region preference."""
    return (round(c.expected_cost, 9), c.hourly_total, c.cloud, c.region_rank, c.region)


def _within_budget(
    ranked: list[Candidate], request: PlanRequest, excluded: list[Exclusion]
) -> list[Candidate]:
    """Drop candidates over --max-hourly / --max-cost; raise when none is left."""
    within = ranked
    for flag, limit, value in (
        ("--max-hourly", request.max_hourly, lambda c: c.hourly_total),
        ("--max-cost", request.max_cost, lambda c: c.expected_cost),
    ):
        if limit is None:
            continue
        kept = [c for c in within if value(c) <= limit]
        if not kept:
            cheapest = min(within, key=value)
            what = "/h" if flag == "--max-hourly" else f" expected for {request.hours:g} h of work"
            raise CatalogError(
                f"over budget: the cheapest fitting offer for {request.nodes} × "
                f"{request.accelerator}, {cheapest.market} {cheapest.where}, costs "
                f"${value(cheapest):,.2f}{what}, over {flag} ${limit:,.2f}; raise {flag} or ask "
                "for fewer nodes or hours"
            )
        for cloud in sorted({c.cloud for c in within} - {c.cloud for c in kept}):
            excluded.append(Exclusion(cloud=cloud, reason=f"every offer is over {flag} ${limit:g}"))
        within = kept
    return within


def _fallbacks(ranked: list[Candidate], limit: int) -> list[Candidate]:
    """The next few candidates in the choice's market, no more than two per cloud at first."""
    choice = ranked[0]
    pool = [c for c in ranked[1:] if c.spot == choice.spot]
    picked: list[Candidate] = []
    per_cloud = {choice.cloud: 1}
    for c in pool:
        if len(picked) < limit and per_cloud.get(c.cloud, 0) < _PER_CLOUD:
            picked.append(c)
            per_cloud[c.cloud] = per_cloud.get(c.cloud, 0) + 1
    for c in pool:  # too few clouds to spread over: fill with more regions, in rank order
        if len(picked) < limit and c not in picked:
            picked.append(c)
    return sorted(picked, key=ranked.index)


def _explain(ranked: list[Candidate], request: PlanRequest, excluded: list[Exclusion]) -> str:
    """One line: why the choice won."""
    choice = ranked[0]
    head = (
        f"{choice.market} {choice.where} wins at ${choice.expected_cost:,.2f} expected for "
        f"{request.hours:g} h of work"
    )
    other = next((c for c in ranked if c.spot != choice.spot), None)
    if other is not None and choice.spot:
        saving = 1 - choice.expected_cost / other.expected_cost
        return (
            f"{head} ({choice.expected_preemptions:.1f} preemptions priced in), {saving:.0%} less "
            f"than the cheapest on-demand, {other.where} at ${other.expected_cost:,.2f}"
        )
    if other is not None:
        return (
            f"{head}: the cheapest spot, {other.where} at ${other.hourly_per_node:,.2f}/h per "
            f"node, would cost ${other.expected_cost:,.2f} once its "
            f"{other.expected_preemptions:.1f} expected preemptions are priced in"
        )
    reason = f"{head}: the cheapest {choice.market} offer"
    if request.spot is SpotPolicy.EITHER:
        missing = "on-demand" if choice.spot else "spot"
        why = [f"{e.cloud}: {e.reason}" for e in excluded]
        reason += f"; no {missing} offer fits" + (f" ({'; '.join(why)})" if why else "")
    else:
        # The runner-up worth naming is another cloud or instance type, not another region.
        nxt = next(
            (
                c
                for c in ranked
                if (c.cloud, c.instance_type) != (choice.cloud, choice.instance_type)
            ),
            None,
        )
        if nxt is not None:
            reason += f"; next best is {nxt.where} at ${nxt.expected_cost:,.2f}"
    return reason
