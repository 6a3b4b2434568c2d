"""The cost model on its own: hand-checked numbers and properties (no catalog needed)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mncloud import plan

HOUR = 1.0
C_60S = 60 / 3600
R_10M = 10 / 60


def test_spot_h100_four_nodes_by_hand() -> None:
    # 4 × p5.48xlarge spot at $10.2397/h, λ = 0.05/h per node, C = 60 s, R = 10 min, W = 24 h.
    # Λ = 0.2/h; τ = √(2 · (1/60) / 0.2) = √(1/6) h = 1469.69 s;
    # overhead = (1/60)/τ + 0.2 · (1/6 + τ/2) = 0.0408248 + 0.0741582 = 0.1149830;
    # T = 24 · 1.1149830 = 26.75959 h; cost = 40.9588 · T = $1096.04; preemptions = 0.2 · T = 5.352.
    est = plan.estimate(4 * 10.2397, 24, 4, 0.05, R_10M, C_60S)
    assert est.interval_hours * 3600 == pytest.approx(1469.69, abs=0.01)
    assert est.hours == pytest.approx(26.75959, abs=1e-4)
    assert est.cost == pytest.approx(1096.04, abs=0.01)
    assert est.preemptions == pytest.approx(5.352, abs=1e-3)
    assert est.loss_fraction == pytest.approx(0.0741582, abs=1e-6)


def test_on_demand_interval_is_clamped_and_checkpoints_still_cost() -> None:
    # Λ = 4 · 1.6e-4; Young's τ = √(2 · (1/60) / 6.4e-4) = 7.2 h > 2 h: clamped to 2 h.
    # overhead = (1/60)/2 + 6.4e-4 · (1/6 + 1) = 0.0083333 + 0.0007467 = 0.0090800.
    est = plan.estimate(127.68, 24, 4, plan.ON_DEMAND_HAZARD_PER_HOUR, R_10M, C_60S)
    assert est.interval_hours == pytest.approx(2.0)
    assert est.hours == pytest.approx(24 * 1.00908, abs=1e-4)
    assert est.cost == pytest.approx(127.68 * 24 * 1.00908, abs=0.01)


def test_no_hazard_and_free_checkpoints_hit_the_bounds() -> None:
    lower, upper = plan.interval_bounds(C_60S)
    assert (lower, upper) == (pytest.approx(300 / 3600), pytest.approx(2.0))
    assert plan.checkpoint_interval(C_60S, 0.0) == upper
    assert plan.checkpoint_interval(0.0, 0.2) == pytest.approx(300 / 3600)
    no_risk = plan.estimate(10.0, 5, 2, 0.0, R_10M, 0.0)
    assert (no_risk.hours, no_risk.cost, no_risk.preemptions) == (5, 50, 0)


def test_slow_checkpoints_widen_the_bounds() -> None:
    # A 3-hour checkpoint cannot be taken every 2 hours: both bounds become C.
    assert plan.interval_bounds(3.0) == (3.0, 3.0)
    assert plan.checkpoint_interval(3.0, 5.0) == 3.0


def test_default_hazards() -> None:
    assert plan.spot_hazard("AWS") == plan.SPOT_HAZARD_PER_HOUR["aws"]
    assert plan.spot_hazard("runpod") == plan.DEFAULT_SPOT_HAZARD_PER_HOUR
    assert min(plan.SPOT_HAZARD_PER_HOUR.values()) / 100 > plan.ON_DEMAND_HAZARD_PER_HOUR


hazards = st.floats(min_value=1e-5, max_value=2.0)
ckpt_hours = st.floats(min_value=1 / 3600, max_value=0.5)
recovery = st.floats(min_value=0.0, max_value=2.0, allow_subnormal=False)
nodes = st.integers(min_value=1, max_value=64)
factor = st.floats(min_value=1.01, max_value=10.0)


def _cost(hazard: float, rec: float, ckpt: float, n: int = 4) -> float:
    return plan.estimate(10.0, 24.0, n, hazard, rec, ckpt).cost


@given(hazards, factor, recovery, ckpt_hours, nodes)
def test_cost_rises_with_the_hazard(
    hazard: float, k: float, rec: float, ckpt: float, n: int
) -> None:
    assert _cost(hazard * k, rec, ckpt, n) > _cost(hazard, rec, ckpt, n)


@given(hazards, recovery, factor, ckpt_hours, nodes)
def test_cost_rises_with_recovery_time(
    hazard: float, rec: float, k: float, ckpt: float, n: int
) -> None:
    longer = rec * k + 0.001
    assert _cost(hazard, longer, ckpt, n) > _cost(hazard, rec, ckpt, n)


@given(hazards, recovery, ckpt_hours, factor, nodes)
def test_cost_rises_with_checkpoint_cost(
    hazard: float, rec: float, ckpt: float, k: float, n: int
) -> None:
    assert _cost(hazard, rec, min(ckpt * k, 5.0), n) > _cost(hazard, rec, ckpt, n)


@given(hazards, ckpt_hours, recovery, st.floats(min_value=0.0, max_value=1.0))
def test_interval_minimises_the_overhead(
    job_hazard: float, ckpt: float, rec: float, where: float
) -> None:
    """τ beats every other interval within the bounds (the overhead is convex in τ)."""
    tau = plan.checkpoint_interval(ckpt, job_hazard)
    lower, upper = plan.interval_bounds(ckpt)
    other = lower + where * (upper - lower)
    best = plan.overhead(tau, ckpt, job_hazard, rec)
    assert best <= plan.overhead(other, ckpt, job_hazard, rec) + 1e-12
    for nudge in (0.999, 1.001):  # and is a local minimum, not just a bound
        near = min(upper, max(lower, tau * nudge))
        assert best <= plan.overhead(near, ckpt, job_hazard, rec) + 1e-12


@given(hazards, ckpt_hours)
def test_interval_is_young_daly_inside_the_bounds(job_hazard: float, ckpt: float) -> None:
    young = math.sqrt(2 * ckpt / job_hazard)
    lower, upper = plan.interval_bounds(ckpt)
    expected = min(upper, max(lower, young))
    assert plan.checkpoint_interval(ckpt, job_hazard) == pytest.approx(expected)


@given(hazards, recovery, ckpt_hours, nodes)
def test_expected_preemptions_are_hazard_times_hours(
    hazard: float, rec: float, ckpt: float, n: int
) -> None:
    est = plan.estimate(3.0, 10.0, n, hazard, rec, ckpt)
    assert est.preemptions == pytest.approx(n * hazard * est.hours)
    assert est.hours >= 10.0
    assert est.cost == pytest.approx(3.0 * est.hours)


# --- --learn: observed preemptions blended with the priors -------------------------------------


def test_blend_by_hand() -> None:
    # (n + λ₀·H₀) / (h + H₀) with λ₀ = 0.05, H₀ = 50: the docstring's examples.
    assert plan.LEARN_PRIOR_NODE_HOURS == 50.0
    assert plan.blend_hazard(0.05, 1, 4.0) == pytest.approx(3.5 / 54)
    assert plan.blend_hazard(0.05, 30, 200.0) == pytest.approx(0.13)
    assert plan.blend_hazard(0.05, 0, 0.0) == 0.05  # no data: the prior
    assert plan.blend_hazard(0.05, 3, 10.0, prior_node_hours=0) == pytest.approx(0.3)


@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=1000),
    st.floats(min_value=0.01, max_value=1e5),
)
def test_blend_lies_between_prior_and_observation(prior: float, n: int, hours: float) -> None:
    blended = plan.blend_hazard(prior, n, hours)
    low, high = sorted((prior, n / hours))
    assert low - 1e-12 <= blended <= high + 1e-12
    # More of the same observation pulls the blend towards it.
    more = plan.blend_hazard(prior, 10 * n, 10 * hours)
    assert abs(more - n / hours) <= abs(blended - n / hours) + 1e-12


def test_learn_hazards_weights_and_skips_local() -> None:
    observed = {
        "AWS": (0.5, 20, 40.0),
        "local": (1.0, 10, 10.0),  # simulated nodes on this machine teach nothing
        "runpod": (0.0, 0, 150.0),
    }
    learned = {h.cloud: h for h in plan.learn_hazards(observed)}
    assert set(learned) == {"aws", "runpod"}
    aws = learned["aws"]
    assert (aws.prior, aws.preemptions, aws.node_hours, aws.observed) == (0.05, 20, 40.0, 0.5)
    assert aws.weight == pytest.approx(40 / 90)
    assert aws.hazard == pytest.approx(22.5 / 90)
    runpod = learned["runpod"]  # 150 quiet node-hours: the 0.1 prior drops to a quarter
    assert runpod.hazard == pytest.approx(0.1 * 50 / 200)


@pytest.mark.catalog  # checks accelerator names against the catalog
def test_request_hazard_precedence() -> None:
    learned = plan.learn_hazards({"aws": (0.5, 20, 40.0)})
    gpus = plan.Accelerator.parse("H100:8")
    request = plan.PlanRequest.build(accelerator=gpus, learned=learned)
    assert request.hazards == {"aws": pytest.approx(0.25)}
    assert request.spot_hazard("AWS") == pytest.approx(0.25)
    assert request.spot_hazard("gcp") == plan.spot_hazard("gcp")
    explicit = plan.PlanRequest.build(accelerator=gpus, learned=learned, hazards={"aws": 0.2})
    assert explicit.spot_hazard("aws") == 0.2  # an explicit per-cloud hazard beats a learned one
    everywhere = plan.PlanRequest.build(accelerator=gpus, learned=learned, preemption_rate=0.01)
    assert everywhere.spot_hazard("aws") == everywhere.spot_hazard("gcp") == 0.01
    with pytest.raises(plan.SpecError, match="negative"):
        plan.PlanRequest.build(accelerator=gpus, hazards={"aws": -1.0})
