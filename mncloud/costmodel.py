"""The cost model: expected hours, preemptions and cost to finish W hours of work on one offer.

SkyPilot's optimizer ranks offers by their hourly sticker price. A spot offer at a third of the
price may still lose: every preemption of any node stops the whole gang, costs a relaunch and
throws away the work since the last checkpoint, and checkpoints themselves take time. These
pure functions (hours in, hours out) price that in; `mncloud.plan` feeds them the catalog.

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

Where λ comes from (`spot_hazard_at`), first match wins
-------------------------------------------------------
1. `--preemption-rate`: one rate for every cloud.
2. `--hazards-from TRACE…`: the user's own spot traces (`mncloud.hazards.Evidence`), weighed
   against what the plan would assume without them.
3. `--learn`: the preemptions in this machine's run records, blended with the measured prior.
4. Measured: the public spot traces (`mncloud.hazards.measured_hazard`), by region where they
   cover it, by cloud otherwise; AWS V100 spot shows 0.33–0.67 preemptions per node-hour.
5. Default: every trace pooled, 0.491/node-h, for a cloud without a trace.

Learning the hazard (`--learn`, `learn_hazards`)
-----------------------------------------------
Your own run records count preemptions per spot node-hour by cloud
(`records.observed_spot_hazard`). Little data must not swing the plan, so the observed rate is
blended with the prior as if the prior had been seen for `LEARN_PRIOR_NODE_HOURS` node-hours
(the posterior mean of a Poisson rate under a gamma prior):

    λ = (preemptions + λ_prior · H₀) / (node_hours + H₀)

e.g. with λ_prior = 0.05/h and H₀ = 50: 1 preemption in 4 node-hours gives 0.065 (not 0.25);
30 in 200 node-hours gives 0.13; the observation's weight is node_hours / (node_hours + H₀).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from mncloud import hazards as trace_hazards
from mncloud.hazards import Evidence
from mncloud.spec import LOCAL_CLOUD

#: On-demand nodes fail too. Meta's "The Llama 3 Herd of Models" (2024, §3.3.4) reports 419
#: unexpected interruptions in 54 days of pre-training on 16,384 H100s (2,048 hosts of 8):
#: 419 / (54·24 h · 2,048) ≈ 1.6e-4 per node-hour. Well-run private clusters, not clouds, but
#: the best public figure at that scale.
ON_DEMAND_HAZARD_PER_HOUR = 1.6e-4
#: Spot hazard for a cloud without a trace: `mncloud.hazards.DEFAULT_HAZARD_PER_HOUR`.
DEFAULT_SPOT_HAZARD_PER_HOUR = trace_hazards.DEFAULT_HAZARD_PER_HOUR
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
#: H₀: how many node-hours of observation the prior is worth when `--learn` blends them.
LEARN_PRIOR_NODE_HOURS = 50.0

MEASURED = "traces"
LEARNED = "learned from run records"
GIVEN = "given per cloud"
RATE_FLAG = "--preemption-rate"


def spot_hazard(cloud: str, region: str | None = None) -> float:
    """The measured spot hazard per node-hour at a place (cloud, region), else the default."""
    return trace_hazards.measured_hazard(cloud, region)[0]


def spot_hazard_at(
    cloud: str,
    region: str | None,
    *,
    preemption_rate: float | None = None,
    evidence: Evidence | None = None,
    per_cloud: Mapping[str, float] | None = None,
    learned: frozenset[str] = frozenset(),
) -> tuple[float, str]:
    """(hazard per node-hour, where it came from) at a place; precedence in the docstring.

    `per_cloud` holds hazards given per cloud; those of the clouds in `learned` came from
    `--learn`. A user's `evidence` is weighed against what would apply without it.
    """
    if preemption_rate is not None:
        return preemption_rate, RATE_FLAG
    cloud = cloud.lower()
    if per_cloud and cloud in per_cloud:
        base = per_cloud[cloud], LEARNED if cloud in learned else GIVEN
    else:
        base = trace_hazards.measured_hazard(cloud, region)
    if evidence is not None:
        found = evidence.hazard(cloud, region, base[0])
        if found is not None:
            return found
    return base


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
