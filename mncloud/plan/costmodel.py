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

Node recovery (`--recovery node`, `estimate_node`)
--------------------------------------------------
Only the lost node is replaced; the others train on, and the replacement heals from a live peer.
The gang trains on while at least m = ceil(N/2) nodes are alive (`spec.min_replicas`), so it
tolerates k = N − m losses at once. A loss becomes a whole-gang failure when k more of the other
N − 1 nodes go within its replacement window R, each with probability p = 1 − e^(−λ·R):

    P_g = P(Binomial(N − 1, p) ≥ k)          (N = 1: k = 0, P_g = 1, i.e. gang recovery)

Of the Λ losses per hour, Λ·(1 − P_g) are node events: R hours at (N−1)/N speed, i.e. R/N hours
of lost work, then one heal of H hours that stalls every node (the peer sends the state). The
other Λ_g = Λ·P_g are gang events, priced as gang recovery prices every preemption: R plus the
work since the last bucket checkpoint, which is written every τ = √(2·C/Λ_g), clamped as above.
Per hour of work

    overhead_node(τ) = C/τ + Λ·(1 − P_g)·(R/N + H) + Λ_g·(R + τ/2)

and T, preemptions (Λ·T, every loss) and cost follow as for gang; whole-gang relaunches are Λ_g·T.
A loss on top of a loss is priced as another node event: second order in λ·R. Two further
simplifications: one replacement takes R (not the shorter time one VM may take, nor the longer
a short spot market may), and correlated reclaims are as rare as independence makes them, which
understates P_g where a cloud takes several nodes at once.

Worked example: AWS us-east-1 H100:8 spot, λ = 0.673/node-h (its traces), N = 4 so Λ = 2.69/h,
R = 10 min, C = 1 min, H = 1 min.
  gang: τ = √(2·(1/60)/2.69) = 0.111 h (6.7 min); overhead = 0.150 + 2.69·(0.167 + 0.056)
        = 0.150 + 0.599 = 0.75, so 75 % extra hours (and 0.60 ≥ `MAX_LOSS_FRACTION`: excluded).
  node: m = 2, k = 2; p = 1 − e^(−0.112) = 0.106; P_g = 3p²(1 − p) + p³ = 0.031, so
        Λ_g = 0.085/h; τ = √(2·(1/60)/0.085) = 0.63 h (38 min); overhead = 0.027
        + 2.69·0.969·(0.042 + 0.017) + 0.085·(0.167 + 0.314) = 0.027 + 0.152 + 0.041 = 0.22.
  So 22 % extra hours, not 75 %, and 1.22/1.75 = 0.70 of gang's cost (30 % cheaper) at the
  same price per hour. The issue's "about 17 %" is C/τ + Λ·(R/N + H) with hourly bucket
  checkpoints (0.017 + 2.69·0.058 = 0.17): it leaves out the whole-gang failures, which add
  about 0.05 (three of four nodes gone within one 10-minute window happens once in 32 losses,
  and then costs 10 min plus half an interval). With hourly checkpoints this model gives 22.5 %.

Where λ comes from (`spot_hazard_at`), first match wins
-------------------------------------------------------
1. `--preemption-rate`: one rate for every cloud.
2. `--hazards-from TRACE…`: the user's own spot traces (`mncloud.plan.hazards.Evidence`), weighed
   against what the plan would assume without them.
3. `--learn`: the preemptions in this machine's run records, blended with the measured prior.
4. Measured: the public spot traces (`mncloud.plan.hazards.measured_hazard`), by region where they
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

from pydantic import BaseModel, ConfigDict, computed_field

from mncloud.plan import hazards as trace_hazards
from mncloud.plan.hazards import Evidence
from mncloud.spec import DEFAULT_CKPT_SECONDS as DEFAULT_CKPT_SECONDS  # re-exported
from mncloud.spec import DEFAULT_RECOVERY_MINUTES as DEFAULT_RECOVERY_MINUTES  # re-exported
from mncloud.spec import LOCAL_CLOUD, Recovery, min_replicas

#: On-demand nodes fail too. Meta's "The Llama 3 Herd of Models" (2024, §3.3.4) reports 419
#: unexpected interruptions in 54 days of pre-training on 16,384 H100s (2,048 hosts of 8):
#: 419 / (54·24 h · 2,048) ≈ 1.6e-4 per node-hour. Well-run private clusters, not clouds, but
#: the best public figure at that scale.
ON_DEMAND_HAZARD_PER_HOUR = 1.6e-4
#: Spot hazard for a cloud without a trace: `mncloud.plan.hazards.DEFAULT_HAZARD_PER_HOUR`.
DEFAULT_SPOT_HAZARD_PER_HOUR = trace_hazards.DEFAULT_HAZARD_PER_HOUR
#: R is `spec.DEFAULT_RECOVERY_MINUTES`, declared with the options (whose help shows it).
#: H: under node recovery, every node waits while the replacement receives the live state (model,
#: optimizer, data position) from a peer over the datacenter network; a guess, like R.
DEFAULT_HEAL_MINUTES = 1.0
#: C is `spec.DEFAULT_CKPT_SECONDS`, declared with the options (whose help shows it).
#: Bounds of the checkpoint interval, in seconds (see the module docstring).
MIN_INTERVAL_S = 300.0
MAX_INTERVAL_S = 7200.0
#: Above this expected fraction of time lost to preemptions the first-order model no longer
#: holds and the job mostly recovers instead of training: such offers are left out.
MAX_LOSS_FRACTION = 0.5
#: H₀: how many node-hours of observation the prior is worth when `--learn` blends them.
LEARN_PRIOR_NODE_HOURS = 50.0

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
    """Expected number of preemptions (node losses), Λ·T."""
    relaunches: float
    """Expected whole-gang relaunches: every preemption under gang recovery, Λ_g·T under node."""
    cost: float
    """Expected USD, hourly_total · T."""
    loss_fraction: float
    """Hours lost to preemptions per hour of work, Λ·(R + τ/2) under gang recovery: beyond
    `MAX_LOSS_FRACTION` the model (and the job) breaks down."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def viable(self) -> bool:
        """Whether the job can finish: `loss_fraction` under `MAX_LOSS_FRACTION`."""
        return self.loss_fraction < MAX_LOSS_FRACTION


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
        relaunches=job_hazard * hours,
        cost=hourly_total * hours,
        loss_fraction=loss_fraction(tau, job_hazard, recovery_hours),
    )


def gang_failure_probability(nodes: int, hazard_per_node: float, recovery_hours: float) -> float:
    """P_g: the chance that a loss under node recovery ends in a whole-gang relaunch.

    That is, that k = N − ceil(N/2) more of the other N − 1 nodes go within its replacement
    window R (module docstring); 1 for one node, which has no peer to heal from.
    """
    tolerated = nodes - min_replicas(nodes)
    if tolerated <= 0:
        return 1.0
    p = -math.expm1(-hazard_per_node * recovery_hours)
    others = nodes - 1
    return sum(
        math.comb(others, k) * p**k * (1 - p) ** (others - k) for k in range(tolerated, others + 1)
    )


def estimate_node(
    hourly_total: float,
    work_hours: float,
    nodes: int,
    hazard_per_node: float,
    recovery_hours: float,
    ckpt_hours: float,
    heal_hours: float = DEFAULT_HEAL_MINUTES / 60,
) -> Estimate:
    """`estimate` under node recovery: overhead C/τ + Λ·(1 − P_g)·(R/N + H) + Λ_g·(R + τ/2)."""
    job_hazard = nodes * hazard_per_node
    gang_hazard = job_hazard * gang_failure_probability(nodes, hazard_per_node, recovery_hours)
    tau = checkpoint_interval(ckpt_hours, gang_hazard)
    node_events = job_hazard - gang_hazard
    lost = node_events * (recovery_hours / nodes + heal_hours)
    lost += loss_fraction(tau, gang_hazard, recovery_hours)
    hours = work_hours * (1 + ckpt_hours / tau + lost)
    return Estimate(
        interval_hours=tau,
        hours=hours,
        preemptions=job_hazard * hours,
        relaunches=gang_hazard * hours,
        cost=hourly_total * hours,
        loss_fraction=lost,
    )


def estimate_with(
    recovery: Recovery,
    hourly_total: float,
    work_hours: float,
    nodes: int,
    hazard_per_node: float,
    recovery_hours: float,
    ckpt_hours: float,
    heal_hours: float = DEFAULT_HEAL_MINUTES / 60,
) -> Estimate:
    """`estimate` (gang) or `estimate_node`, by the run's recovery mode."""
    args = (hourly_total, work_hours, nodes, hazard_per_node, recovery_hours, ckpt_hours)
    if recovery is Recovery.NODE:
        return estimate_node(*args, heal_hours=heal_hours)
    return estimate(*args)
