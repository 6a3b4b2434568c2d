"""Cost-aware planning: put the job where it costs least *to finish*, not where $/h is lowest.

The planner asks SkyPilot's catalog for every fitting offer (`catalog.offers`), prices each with
the cost model (`plan.costmodel`: expected hours, preemptions and cost, spot hazards from the
traces or the user), keeps those within budget and ranks them by expected cost. The choice and a
few fallbacks in its market become SkyPilot's `resources.ordered`.

Offers are priced under the run's recovery mode (`JobSpec.recovery`, gang or node); both modes'
outcomes ride along (`Candidate.by_recovery`, `Plan.other_choice`) for `plan --verbose`.
"""

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

from mncloud.catalog import Exclusion, Offer
from mncloud.errors import CatalogError, SpecError, first_error
from mncloud.plan.costmodel import (
    DEFAULT_CKPT_SECONDS,
    DEFAULT_HEAL_MINUTES,
    DEFAULT_RECOVERY_MINUTES,
    MAX_LOSS_FRACTION,
    ON_DEMAND_HAZARD_PER_HOUR,
    Estimate,
    LearnedHazard,
    estimate_with,
    gang_failure_probability,
    learn_hazards,
    spot_hazard_at,
)
from mncloud.plan.hazards import Evidence, TraceHazard
from mncloud.spec import (
    DEFAULT_HOURS,
    LOCAL_CLOUD,
    MAX_NODES,
    Accelerator,
    JobSpec,
    Recovery,
    SpotPolicy,
    canonical_cloud,
    default_of,
    min_replicas,
)

__all__ = [
    "MAX_FALLBACKS",
    "Candidate",
    "LearnedHazard",
    "Plan",
    "PlanRequest",
    "learn_hazards",
    "make_plan",
]

#: How many fallbacks a plan hands SkyPilot after its choice, and at most how many entries
#: (choice included) may come from one cloud before other clouds get a turn.
MAX_FALLBACKS = 4
_PER_CLOUD = 2


# --- the request and the plan ------------------------------------------------------------------


class PlanRequest(BaseModel):
    """What to plan: the hardware, how long, which markets and clouds, budgets, model inputs."""

    model_config = ConfigDict(frozen=True)

    accelerator: Accelerator
    nodes: int = Field(default_of("nodes"), ge=1, le=MAX_NODES)
    spot: SpotPolicy = default_of("spot")
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

    @property
    def other_recovery(self) -> Recovery:
        """The recovery mode this request does not price its choice under."""
        return Recovery.GANG if self.recovery is Recovery.NODE else Recovery.NODE

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
            "recovery": spec.recovery,
        }
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls.build(**fields)


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
    priced = [_candidate(offer, request) for offer in search.offers]
    candidates: list[Candidate] = []
    broken: dict[tuple[str, bool], list[Candidate]] = {}
    for c in priced:
        if c.by_recovery[c.recovery].viable:
            candidates.append(c)
        else:
            broken.setdefault((c.cloud, c.spot), []).append(c)
    for (cloud, _spot), group in sorted(broken.items()):
        excluded.append(Exclusion(cloud=cloud, reason=_unfinishable(group, request)))
    if not candidates:
        raise CatalogError(
            f"no {request.accelerator} offer can finish: "
            + "; ".join(f"{e.cloud}: {e.reason}" for e in excluded)
        )
    candidates.sort(key=_rank)
    within = _within_budget(candidates, request, excluded)
    choice = within[0]
    plan = Plan(
        request=request,
        choice=choice,
        fallbacks=_fallbacks(within, max_fallbacks),
        candidates=within,
        checkpoint_interval_s=choice.checkpoint_interval_s,
        other_choice=_other_choice(priced, request),
        excluded=excluded,
        explanation=_explain(within, request, excluded),
    )
    if request.recovery is Recovery.NODE:
        plan.explanation += "; " + recovery_note(plan)
    return plan


def _unfinishable(group: list[Candidate], request: PlanRequest) -> str:
    """Why one cloud's offers in one market are left out: they would mostly recover."""
    c = min(group, key=lambda c: c.hourly_total)
    regions = len({b.region for b in group}) - 1
    where = f"{c.market} in {c.region}" + (f" (+{regions} regions)" if regions else "")
    node, hint = c.by_recovery.get(Recovery.NODE), "; use fewer nodes or on-demand"
    if request.recovery is Recovery.NODE:
        hint = ", even with node recovery" + hint
    elif node is not None and node.viable:
        hint += (  # the node model's loss, which is under the limit
            f", or --recovery node (it would lose {node.loss_fraction:.0%}; the script must "
            "use mncloud.train.Replicas)"
        )
    return (
        f"{where}: at {c.preemption_rate:.3g} preemptions per node-hour ({c.hazard_source}) × "
        f"{request.nodes} nodes the job would lose over {MAX_LOSS_FRACTION:.0%} of its time "
        f"recovering{hint} (or set --preemption-rate if you know the rate is lower)"
    )


def _candidate(offer: Offer, request: PlanRequest) -> Candidate:
    """The offer priced under every recovery mode the request's node count allows."""
    if offer.spot:
        hazard, source = request.spot_hazard_at(offer.cloud, offer.region)
    else:
        hazard, source = ON_DEMAND_HAZARD_PER_HOUR, "on-demand hardware faults"
    hourly_total = offer.hourly_price * request.nodes
    modes = [Recovery.GANG, Recovery.NODE] if request.nodes >= 2 else [Recovery.GANG]
    outcomes = {mode: _outcome(mode, hourly_total, hazard, request) for mode in modes}
    own = outcomes[request.recovery]
    return Candidate(
        cloud=offer.cloud,
        region=offer.region,
        instance_type=offer.instance_type,
        accelerator=f"{offer.accelerator}:{offer.accelerator_count}",
        spot=offer.spot,
        hourly_per_node=offer.hourly_price,
        hourly_total=hourly_total,
        expected_hours=own.hours,
        expected_cost=own.cost,
        expected_preemptions=own.preemptions,
        checkpoint_interval_s=own.interval_hours * 3600,
        preemption_rate=hazard,
        hazard_source=source,
        recovery=request.recovery,
        by_recovery=outcomes,
        region_rank=offer.region_rank,
    )


def _outcome(mode: Recovery, hourly_total: float, hazard: float, request: PlanRequest) -> Estimate:
    hours = request.recovery_minutes / 60, request.ckpt_seconds / 3600, request.heal_minutes / 60
    return estimate_with(mode, hourly_total, request.hours, request.nodes, hazard, *hours)


def _other_choice(priced: list[Candidate], request: PlanRequest) -> Candidate | None:
    """The offer the other recovery mode would choose, within the same budgets, or None."""
    mode = request.other_recovery
    pool = [
        c
        for c in priced
        if (o := c.by_recovery.get(mode)) is not None
        and o.viable
        and (request.max_hourly is None or c.hourly_total <= request.max_hourly)
        and (request.max_cost is None or o.cost <= request.max_cost)
    ]
    return min(pool, key=lambda c: _rank(c, mode), default=None)


def recovery_note(plan: Plan) -> str:
    """One sentence: what the other recovery mode would choose, or cost, beside this plan's."""
    request, choice, other = plan.request, plan.choice, plan.other_choice
    mode = request.other_recovery
    if request.recovery is Recovery.NODE:
        lost, window = request.nodes - min_replicas(request.nodes) + 1, request.recovery_minutes
        share = gang_failure_probability(request.nodes, choice.preemption_rate, window / 60)
        head = (
            f"with node recovery {share:.1%} of losses relaunch the gang ({lost} of "
            f"{request.nodes} nodes lost within {window:g} min); gang recovery would"
        )
    else:
        head = "--recovery node (for a script using mncloud.train.Replicas) would"
    if other is None:
        return f"{head} find no offer that can finish within budget"
    mine, theirs = choice.by_recovery[mode], other.by_recovery[mode]  # 2+ nodes: both modes
    if mine.viable and mine.cost <= theirs.cost:
        return f"{head} cost ${mine.cost:,.2f} here"
    here = (
        f"${mine.cost:,.2f} here"
        if mine.viable
        else f"here it would lose over {MAX_LOSS_FRACTION:.0%} of its time recovering"
    )
    return f"{head} choose {other.market} {other.where} at ${theirs.cost:,.2f} ({here})"


def _rank(c: Candidate, mode: Recovery | None = None) -> tuple[float, float, str, int, str]:
    """Expected cost (under `mode`, else its own), the sticker, SkyPilot's region preference."""
    cost = c.expected_cost if mode is None else c.by_recovery[mode].cost
    return (round(cost, 9), c.hourly_total, c.cloud, c.region_rank, c.region)


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
