"""Cost-aware planning: put the job where it costs least *to finish*, not where $/h is lowest.

The planner asks SkyPilot's catalog for every fitting offer of every GPU type asked for
(`catalog.offers`), times the script's step on each (`plan.timing`: the step-time model over
the hardware facts, when there is a workload), prices each with the cost model
(`plan.costmodel`: expected hours, preemptions and cost, spot hazards from the traces or the
user), keeps those within budget and ranks them by expected cost (or time, `--minimize`).
The choice and a few fallbacks in its market become SkyPilot's `resources.ordered`.

Offers are priced under the run's recovery mode (`JobSpec.recovery`, gang or node); both modes'
outcomes ride along (`Candidate.by_recovery`, `Plan.other_choice`) for `plan --verbose`.

    model.py      the vocabulary: `PlanRequest`, `Candidate`, the plan
    costmodel.py  expected hours, preemptions and cost to finish on one offer
    hazards.py    spot hazards per node-hour, measured on the traces
    traces.py     the one model of a spot trace
    learned.py    what earlier runs measured (`plan --learn`)
    hardware.py   GPU and network facts from `hardware.yaml`
    stepmodel.py  one optimizer step on an offer: compute plus exposed network
    sharding.py   DDP, FSDP or HSDP: memory per GPU and traffic per step of each layout
    timing.py     each offer's step time and hours of work
    profile.py    a script's measured step (`mncloud profile`), kept by script version
    explain.py    why the plan chose what it chose, one line each
"""

from __future__ import annotations

from mncloud.catalog import Exclusion, Offer
from mncloud.errors import CatalogError
from mncloud.plan.costmodel import (
    ON_DEMAND_HAZARD_PER_HOUR,
    Estimate,
    LearnedHazard,
    estimate_with,
    learn_hazards,
)
from mncloud.plan.explain import explain, recovery_note, unfinishable
from mncloud.plan.model import MAX_FALLBACKS, Candidate, Minimize, Plan, PlanRequest
from mncloud.plan.timing import OfferTime, time_offers
from mncloud.spec import Recovery

__all__ = [
    "MAX_FALLBACKS",
    "Candidate",
    "LearnedHazard",
    "Minimize",
    "Plan",
    "PlanRequest",
    "learn_hazards",
    "make_plan",
    "recovery_note",
]

#: At most how many plan entries (choice included) may come from one cloud before other clouds
#: get a turn.
_PER_CLOUD = 2


def make_plan(request: PlanRequest, *, max_fallbacks: int = MAX_FALLBACKS) -> Plan:
    """Rank every offer SkyPilot's catalog has for the request by expected cost to finish.

    Raises CatalogError when no offer fits (with what is available) or all are over budget.
    """
    offers, excluded = _offers(request)
    timed, unfit = time_offers(offers, request)
    excluded += unfit
    priced = [_candidate(offer, request, timing) for offer, timing in timed.items()]
    candidates: list[Candidate] = []
    broken: dict[tuple[str, bool], list[Candidate]] = {}
    for c in priced:
        if c.by_recovery[c.recovery].viable:
            candidates.append(c)
        else:
            broken.setdefault((c.cloud, c.spot), []).append(c)
    for (cloud, _spot), group in sorted(broken.items()):
        excluded.append(Exclusion(cloud=cloud, reason=unfinishable(group, request)))
    if not candidates:
        raise CatalogError(
            f"no {request.gpus_text} offer can finish: "
            + "; ".join(f"{e.cloud}: {e.reason}" for e in excluded)
        )
    candidates.sort(key=lambda c: _rank(c, minimize=request.minimize))
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
        explanation=explain(within, request, excluded),
    )
    if request.recovery is Recovery.NODE:
        plan.explanation += "; " + recovery_note(plan)
    if choice.parallel is not None:
        plan.explanation += ". " + layout_note(choice)
    return plan


def layout_note(c: Candidate) -> str:
    """The choice's parallelism and why, recomputation, memory, efficiency, in words."""
    recompute = "" if c.recompute in (None, "none") else f", {c.recompute} recomputation"
    assert c.parallel is not None and c.mfu is not None
    return (
        f"{c.parallel.value.upper()} ({c.parallel_why}){recompute}, "
        f"{c.memory_per_gpu_gib or 0:,.1f} GiB per GPU; MFU {c.mfu:.2f}: "
        f"{c.mfu_source.split(' (')[0]}"
    )


def _offers(request: PlanRequest) -> tuple[list[Offer], list[Exclusion]]:
    """Every offer of every GPU type asked for; a type with none is an exclusion while
    another type has some (else the first type's CatalogError, which says what exists)."""
    from mncloud import catalog

    offers: list[Offer] = []
    excluded: list[Exclusion] = []
    errors: list[CatalogError] = []
    for accelerator in request.accelerators:
        try:
            search = catalog.offers(
                accelerator.name,
                accelerator.count,
                clouds=request.clouds,
                regions=request.regions,
                use_spot=request.spot.use_spot,
                nodes=request.nodes,
            )
        except CatalogError as err:
            errors.append(err)
            continue
        offers += search.offers
        excluded += [e for e in search.excluded if e not in excluded]
    if not offers:
        raise errors[0]
    for accelerator, err in zip(request.accelerators, errors, strict=False):
        if len(request.accelerators) > 1:
            excluded.append(Exclusion(cloud=str(accelerator), reason=str(err).split(". ")[0]))
    return offers, excluded


def _candidate(offer: Offer, request: PlanRequest, timing: OfferTime) -> Candidate:
    """The offer priced under every recovery mode the request's node count allows."""
    if offer.spot:
        hazard, source = request.spot_hazard_at(offer.cloud, offer.region)
    else:
        hazard, source = ON_DEMAND_HAZARD_PER_HOUR, "on-demand hardware faults"
    hourly_total = offer.hourly_price * request.nodes
    modes = [Recovery.GANG, Recovery.NODE] if request.nodes >= 2 else [Recovery.GANG]
    work = timing.work_hours
    outcomes = {mode: _outcome(mode, hourly_total, hazard, request, work) for mode in modes}
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
        step_seconds=None if timing.step is None else timing.step.step_seconds,
        compute_seconds=None if timing.step is None else timing.step.compute_seconds,
        comm_seconds=None if timing.step is None else timing.step.comm_seconds,
        exposed_comm_seconds=None if timing.step is None else timing.step.exposed_comm_seconds,
        bound=None if timing.step is None else timing.step.bound,
        work_hours=work,
        network=timing.network,
        **_layout_fields(timing),
    )


def _layout_fields(timing: OfferTime) -> dict[str, object]:
    """What the step assumed: parallelism and why, recomputation, memory, efficiency."""
    layout, step = timing.layout, timing.step
    if layout is None or step is None:
        return {}
    return {
        "parallel": layout.parallel,
        "parallel_why": layout.why,
        "recompute": layout.recompute,
        "memory_per_gpu_gib": layout.memory_bytes / 2**30,
        "mfu": step.mfu,
        "mfu_source": step.mfu_source,
    }


def _outcome(
    mode: Recovery, hourly_total: float, hazard: float, request: PlanRequest, work_hours: float
) -> Estimate:
    hours = request.recovery_minutes / 60, request.ckpt_seconds / 3600, request.heal_minutes / 60
    return estimate_with(mode, hourly_total, work_hours, request.nodes, hazard, *hours)


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
    return min(pool, key=lambda c: _rank(c, mode, request.minimize), default=None)


def _rank(
    c: Candidate, mode: Recovery | None = None, minimize: Minimize = Minimize.COST
) -> tuple[float, ...] | tuple[float | str | int, ...]:
    """Expected cost (or hours, `--minimize time`; under `mode`, else its own), then the other,
    the sticker, SkyPilot's region preference."""
    own = c.by_recovery[mode] if mode is not None else None
    cost = c.expected_cost if own is None else own.cost
    hours = c.expected_hours if own is None else own.hours
    first, second = (hours, cost) if minimize is Minimize.TIME else (cost, hours)
    return (round(first, 9), round(second, 9), c.hourly_total, c.cloud, c.region_rank, c.region)


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
            what = "/h" if flag == "--max-hourly" else f" expected for {request.work}"
            raise CatalogError(
                f"over budget: the cheapest fitting offer for {request.nodes} × "
                f"{request.gpus_text}, {cheapest.market} {cheapest.where}, costs "
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
