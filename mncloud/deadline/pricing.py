"""`plan --deadline`: what each place is expected to cost when the deadline policy runs there.

For every place of a plan (cloud, region, instance type) the figures are: the expected cost under
the deadline policy (`policy.DEFAULT_POLICY` unless told), the cost all on-demand, the cost and
the chance of finishing in time on spot alone, and the slack the deadline leaves. They follow
the replay model of `deadline.replay` exactly (ticks, a restart overhead of `--recovery-minutes`
per launch, no work lost at a preemption), not the Young–Daly model of the plan's own table.

The estimator: the policy is replayed (`replay.replay`) over `WINDOWS` availability windows
drawn from an alternating renewal process, a Monte Carlo mean over a fixed seed so the same
plan always shows the same figures. Spot for the gang is up for exponential intervals of rate
N·λ (λ the candidate's spot hazard per node-hour, as the plan assumes it) and away for
exponential gaps of mean `hazards.MEAN_SPOT_GAP_HOURS` (2.06 h, measured on the traces); a
window starts in either state with its long-run probability. Exponential intervals keep it
consistent with the plan's constant hazard; the traces' gaps are more skewed (median ~30 min),
so the figures are a model's, and `mncloud replay` gives a real trace's.

The policies decide from time, work and availability alone (none reads a price; a test holds
them to it), so the hours each market is used are simulated once per distinct hazard and priced
per place: a plan with a few hazards stays within a second or two. A place is paired with its
own on-demand price when it has one, else with the cheapest on-demand offer of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict

from mncloud.deadline.policy import DEFAULT_POLICY, Job, make_policy, smaller_world_breakeven
from mncloud.deadline.replay import replay
from mncloud.errors import CatalogError, SpecError
from mncloud.plan import Candidate, Plan
from mncloud.plan.hazards import MEAN_SPOT_GAP_HOURS
from mncloud.spec import MIN_NODES, SpotPolicy, min_nodes_error

#: Availability windows per hazard: the Monte Carlo sample (standard error ≈ 1–2% of the cost).
WINDOWS = 200
#: The sample's seed: the same plan always shows the same figures.
SEED = 13
#: Tick length, as the traces' (`gap_seconds`); longer deadlines use coarser ticks so that a
#: window has at most `MAX_TICKS` of them.
GAP_SECONDS = 300
MAX_TICKS = 1440


def tick_seconds(deadline_s: float) -> int:
    """The tick for a deadline: 5 minutes, or a multiple of it for deadlines over 5 days."""
    return GAP_SECONDS * max(1, math.ceil(deadline_s / GAP_SECONDS / MAX_TICKS))


def deadline_job(
    *,
    nodes: int,
    hours: float,
    deadline_s: float,
    recovery_minutes: float,
    spot_price: float = 1.0,
    on_demand_price: float = 1.0,
) -> Job:
    """The replay model's Job; SpecError naming the earliest feasible deadline if too short."""
    return Job.build(
        nodes=nodes,
        hours=hours,
        deadline_s=deadline_s,
        overhead_s=recovery_minutes * 60,
        gap_s=tick_seconds(deadline_s),
        spot_price=spot_price,
        on_demand_price=on_demand_price,
    )


@dataclass(frozen=True)
class Availability:
    """Spot for the gang: up for Exp(rate `job_hazard`/h), away for Exp(mean `mean_gap_hours`)."""

    job_hazard: float
    mean_gap_hours: float = MEAN_SPOT_GAP_HOURS

    def sample(self, windows: int, ticks: int, gap_s: int, seed: int = SEED) -> np.ndarray:
        """A (windows, ticks) bool array: spot there at the start of each tick."""
        horizon = ticks * gap_s / 3600
        if self.job_hazard <= 0:
            return np.ones((windows, ticks), dtype=bool)
        rng = np.random.default_rng(seed)
        mean_up = 1 / self.job_hazard
        starts_up = rng.random(windows) < mean_up / (mean_up + self.mean_gap_hours)
        cycles = int(2 * horizon / (mean_up + self.mean_gap_hours)) + 8
        times = np.arange(ticks) * gap_s / 3600
        out = np.empty((windows, ticks), dtype=bool)
        for w in range(windows):
            ends = np.empty(0)
            while not len(ends) or ends[-1] <= horizon:
                up = rng.exponential(mean_up, cycles)
                gap = rng.exponential(self.mean_gap_hours, cycles)
                pairs = np.stack([up, gap] if starts_up[w] else [gap, up], axis=1).ravel()
                ends = np.concatenate([ends, (ends[-1] if len(ends) else 0) + np.cumsum(pairs)])
            segment = np.searchsorted(ends, times, side="right")
            out[w] = (segment % 2 == 0) == starts_up[w]
        return out


class MarketHours(BaseModel):
    """Mean hours per market over the sample, for one hazard: prices make them dollars."""

    model_config = ConfigDict(frozen=True)

    spot_hours: float
    on_demand_hours: float
    finish_hours: float
    """Mean hours from the start to the end of the work."""
    met: float
    """Fraction of windows that met the deadline (1.0 while on-demand exists)."""
    spot_only_hours: float
    """Mean billed spot hours on spot alone (until done, or the sample's end)."""
    spot_only_met: float
    """Fraction of windows in which spot alone finished by the deadline."""


def market_hours(
    job: Job, job_hazard: float, policy: str, windows: int = WINDOWS, min_nodes: int | None = None
) -> MarketHours:
    """Replay `policy` (riding gaps on `min_nodes`: `replay._Ride`) over `windows` sampled
    windows; spot-only over the same windows."""
    long = 4 * job.deadline_ticks  # spot alone may take far longer than the deadline
    available = Availability(job_hazard).sample(windows, long, job.gap_seconds)
    results = [replay(make_policy(policy, job), row, 0, min_nodes=min_nodes) for row in available]
    alone = [_spot_only(job, row) for row in available]
    return MarketHours(
        spot_hours=float(np.mean([r.spot_hours for r in results])),
        on_demand_hours=float(np.mean([r.on_demand_hours for r in results])),
        finish_hours=float(
            np.mean([r.finished_hours or job.hours(job.deadline_ticks) for r in results])
        ),
        met=float(np.mean([r.met_deadline for r in results])),
        spot_only_hours=float(np.mean([job.hours(billed) for billed, _ in alone])),
        spot_only_met=float(np.mean([done <= job.deadline_ticks for _, done in alone])),
    )


def _spot_only(job: Job, available: np.ndarray) -> tuple[int, int]:
    """(billed ticks, tick the work is done) on spot alone: launch on every spot run.

    A run of L ticks pays `overhead_ticks` then works; work not done at the sample's end counts
    as done there (so the cost is a lower bound and the window a miss).
    """
    edges = np.diff(np.concatenate([[0], available.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    work = billed = 0
    for start, end in zip(starts, ends, strict=True):
        need = job.overhead_ticks + job.work_ticks - work
        if end - start >= need:
            return billed + need, start + need
        billed += end - start
        work += max(0, end - start - job.overhead_ticks)
    return billed, len(available) + 1


class PlaceEstimate(BaseModel):
    """The deadline figures of one place, priced."""

    model_config = ConfigDict(frozen=True)

    cloud: str
    region: str
    instance_type: str
    spot_per_node: float | None
    """Spot $/h per node here; None where only on-demand is offered (the policy cannot save)."""
    on_demand_per_node: float
    on_demand_where: str
    """Where the on-demand hours run: `here`, or the cloud and region of the plan's cheapest
    on-demand offer."""
    hazard: float | None
    expected_cost: float
    """Expected cost under the policy."""
    on_demand_cost: float
    spot_only_cost: float | None
    spot_only_met: float | None
    """Fraction of the sample in which spot alone meets the deadline."""
    spot_hours: float
    on_demand_hours: float
    finish_hours: float
    met: float

    @property
    def where(self) -> str:
        return f"{self.cloud} {self.instance_type} in {self.region}"

    def is_at(self, c: Candidate) -> bool:
        return (self.cloud, self.region, self.instance_type) == (
            c.cloud,
            c.region,
            c.instance_type,
        )


class ElasticRide(BaseModel):
    """`--min-nodes K`: what riding a spot shortfall on K < N nodes is worth, by the rule the
    controller follows (`policy.smaller_world_pays`) over this model's mean gap. The figures
    per place include it (`replay._Ride`: each gap taken as a dip to K nodes, an upper bound)."""

    model_config = ConfigDict(frozen=True)

    min_nodes: int
    nodes: int
    breakeven_hours: float
    """A shortfall must be expected to last longer than this for K nodes to pay."""
    mean_gap_hours: float
    pays: bool
    """Whether the model's mean gap outlasts the break-even (the controller trains on K)."""
    work_hours_per_gap: float
    """N-node hours of work done over a mean gap on K nodes (after its relaunch), which the
    gang waits out without progress."""

    def line(self) -> str:
        """One sentence for the plan's output."""
        head = (
            f"--min-nodes {self.min_nodes}: a shortfall of spot rides on {self.min_nodes} of "
            f"{self.nodes} nodes (slower steps, the same cost per unit of work) once it is "
            f"expected to outlast {self.breakeven_hours:.2f} h"
        )
        if not self.pays:
            return f"{head}; the mean gap, {self.mean_gap_hours:g} h, is shorter: the gang waits."
        return (
            f"{head}; over the mean gap of {self.mean_gap_hours:g} h it trains "
            f"{self.work_hours_per_gap:.2f} h of the {self.nodes}-node work the gang would wait "
            f"out. The figures above include it, each gap taken as a dip to {self.min_nodes} "
            "nodes (an upper bound: a gap may leave fewer)."
        )


def elastic_ride(
    job: Job, min_nodes: int, mean_gap_hours: float = MEAN_SPOT_GAP_HOURS
) -> ElasticRide:
    """What `--min-nodes` is worth over the model's mean gap (SpecError when out of range)."""
    if not MIN_NODES <= min_nodes <= job.nodes:
        raise SpecError(min_nodes_error(min_nodes, job.nodes))
    breakeven = job.hours(1) * smaller_world_breakeven(job, min_nodes)
    overhead = job.hours(job.overhead_ticks)
    pays = min_nodes < job.nodes and mean_gap_hours > breakeven
    work = max(0.0, mean_gap_hours - overhead) * min_nodes / job.nodes if pays else 0.0
    return ElasticRide(
        min_nodes=min_nodes, nodes=job.nodes, breakeven_hours=breakeven,
        mean_gap_hours=mean_gap_hours, pays=pays, work_hours_per_gap=work,
    )  # fmt: skip


class DeadlineReport(BaseModel):
    """Every place of a plan under a deadline, cheapest expected cost first."""

    policy: str
    hours: float
    deadline_hours: float
    recovery_minutes: float
    slack_hours: float
    """Deadline minus the work and one restart: the time the job may spend without progress."""
    gap_seconds: int
    windows: int
    seed: int
    mean_gap_hours: float
    budget: float | None
    places: list[PlaceEstimate]
    choice: PlaceEstimate
    """The place of the plan's choice."""
    elastic: ElasticRide | None = None
    """`--min-nodes`: what riding a shortfall on fewer nodes is worth (None: the gang waits)."""

    @property
    def cheapest(self) -> PlaceEstimate:
        return self.places[0]

    def for_candidate(self, c: Candidate) -> PlaceEstimate | None:
        return next((p for p in self.places if p.is_at(c)), None)

    def over_budget(self) -> str | None:
        """A warning when the choice is expected to cost more than the budget, else None."""
        if self.budget is None or self.choice.expected_cost <= self.budget:
            return None
        return (
            f"the choice, {self.choice.where}, is expected to cost "
            f"${self.choice.expected_cost:,.2f} under the {self.policy} policy, over --budget "
            f"${self.budget:,.2f}; the least expected cost is ${self.cheapest.expected_cost:,.2f} "
            f"({self.cheapest.where})"
        )


def estimate_deadline(
    plan: Plan,
    deadline_s: float,
    *,
    budget: float | None = None,
    policy: str = DEFAULT_POLICY,
    windows: int = WINDOWS,
    min_nodes: int | None = None,
) -> DeadlineReport:
    """The deadline figures of every place in the plan (and what `min_nodes` is worth);
    SpecError on a deadline too short or a budget below the least expected cost (naming it)."""
    request = plan.request
    if request.spot is not SpotPolicy.EITHER:
        raise SpecError("--deadline mixes spot and on-demand: drop --spot / --on-demand")
    if budget is not None and budget <= 0:
        raise SpecError(f"--budget {budget:g}: it must be positive")
    job = deadline_job(
        nodes=request.nodes,
        hours=request.hours,
        deadline_s=deadline_s,
        recovery_minutes=request.recovery_minutes,
    )
    make_policy(policy, job)  # SpecError naming the choices
    elastic = None if min_nodes is None else elastic_ride(job, min_nodes)
    cache: dict[float, MarketHours] = {}
    places = sorted(
        (
            _place(job, spot, od, policy, windows, cache, min_nodes)
            for spot, od in pairs(plan.candidates)
        ),
        key=lambda p: (round(p.expected_cost, 9), p.on_demand_cost),
    )
    choice = next(p for p in places if p.is_at(plan.choice))
    report = DeadlineReport(
        policy=policy,
        hours=request.hours,
        deadline_hours=deadline_s / 3600,
        recovery_minutes=request.recovery_minutes,
        slack_hours=job.hours(job.deadline_ticks - job.min_ticks),
        gap_seconds=job.gap_seconds,
        windows=windows,
        seed=SEED,
        mean_gap_hours=MEAN_SPOT_GAP_HOURS,
        budget=budget,
        places=places,
        choice=choice,
        elastic=elastic,
    )
    if budget is not None and budget < report.cheapest.expected_cost:
        raise SpecError(
            f"--budget ${budget:,.2f} is below the least expected cost by the "
            f"{deadline_s / 3600:g} h deadline: ${report.cheapest.expected_cost:,.2f} "
            f"({report.cheapest.where}, {policy} policy)"
        )
    return report


def refuse_over_budget(
    plan: Plan, deadline_s: float, budget: float, *, policy: str = DEFAULT_POLICY
) -> DeadlineReport:
    """`up --deadline --budget`: SpecError when the plan's choice is expected to cost more."""
    report = estimate_deadline(plan, deadline_s, budget=budget, policy=policy)
    warning = report.over_budget()
    if warning:
        raise SpecError(f"not launched: {warning}")
    return report


def pairs(candidates: Iterable[Candidate]) -> list[tuple[Candidate | None, Candidate]]:
    """(spot, on-demand) per place: its own on-demand offer, else the cheapest on-demand."""
    ranked = list(candidates)
    on_demand = [c for c in ranked if not c.spot]
    if not on_demand:
        raise CatalogError("--deadline needs an on-demand offer to fall back on; none fits")
    cheapest = min(on_demand, key=lambda c: (c.hourly_per_node, c.region_rank))
    own = {(c.cloud, c.region, c.instance_type): c for c in on_demand}
    out: list[tuple[Candidate | None, Candidate]] = []
    seen = set()
    for c in ranked:
        key = (c.cloud, c.region, c.instance_type)
        if key in seen:
            continue
        seen.add(key)
        spot = (
            c
            if c.spot
            else next(
                (s for s in ranked if s.spot and (s.cloud, s.region, s.instance_type) == key), None
            )
        )
        out.append((spot, own.get(key, cheapest)))
    return out


def _place(
    job: Job,
    spot: Candidate | None,
    od: Candidate,
    policy: str,
    windows: int,
    cache: dict[float, MarketHours],
    min_nodes: int | None = None,
) -> PlaceEstimate:
    """One place's figures: the cached hours per market, priced at the place's offers."""
    here = spot or od
    node_h = job.nodes  # hours × nodes × $/node-hour
    od_cost = job.min_ticks * job.gap_seconds / 3600 * node_h * od.hourly_per_node
    if spot is None:
        return PlaceEstimate(
            cloud=here.cloud,
            region=here.region,
            instance_type=here.instance_type,
            spot_per_node=None,
            on_demand_per_node=od.hourly_per_node,
            on_demand_where="here",
            hazard=None,
            expected_cost=od_cost,
            on_demand_cost=od_cost,
            spot_only_cost=None,
            spot_only_met=None,
            spot_hours=0.0,
            on_demand_hours=job.hours(job.min_ticks),
            finish_hours=job.hours(job.min_ticks),
            met=1.0,
        )
    gang = round(job.nodes * spot.preemption_rate, 6)
    if gang not in cache:
        cache[gang] = market_hours(job, gang, policy, windows, min_nodes)
    h = cache[gang]
    return PlaceEstimate(
        cloud=here.cloud,
        region=here.region,
        instance_type=here.instance_type,
        spot_per_node=spot.hourly_per_node,
        on_demand_per_node=od.hourly_per_node,
        on_demand_where="here" if od.where == spot.where else f"{od.cloud} {od.region}",
        hazard=spot.preemption_rate,
        expected_cost=node_h
        * (h.spot_hours * spot.hourly_per_node + h.on_demand_hours * od.hourly_per_node),
        on_demand_cost=od_cost,
        spot_only_cost=node_h * h.spot_only_hours * spot.hourly_per_node,
        spot_only_met=h.spot_only_met,
        spot_hours=h.spot_hours,
        on_demand_hours=h.on_demand_hours,
        finish_hours=h.finish_hours,
        met=h.met,
    )
