"""The cost model on its own: hand-checked numbers and properties (no catalog needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mncloud import plan
from mncloud.errors import SpecError
from mncloud.plan import costmodel
from mncloud.plan import hazards as trace_hazards
from mncloud.spec import Accelerator

HOUR = 1.0
C_60S = 60 / 3600
R_10M = 10 / 60


def test_spot_h100_four_nodes_by_hand() -> None:
    # 4 × p5.48xlarge spot at $10.2397/h, λ = 0.05/h per node, C = 60 s, R = 10 min, W = 24 h.
    # Λ = 0.2/h; τ = √(2 · (1/60) / 0.2) = √(1/6) h = 1469.69 s;
    # overhead = (1/60)/τ + 0.2 · (1/6 + τ/2) = 0.0408248 + 0.0741582 = 0.1149830;
    # T = 24 · 1.1149830 = 26.75959 h; cost = 40.9588 · T = $1096.04; preemptions = 0.2 · T = 5.352.
    est = costmodel.estimate(4 * 10.2397, 24, 4, 0.05, R_10M, C_60S)
    assert est.interval_hours * 3600 == pytest.approx(1469.69, abs=0.01)
    assert est.hours == pytest.approx(26.75959, abs=1e-4)
    assert est.cost == pytest.approx(1096.04, abs=0.01)
    assert est.preemptions == pytest.approx(5.352, abs=1e-3)
    assert est.loss_fraction == pytest.approx(0.0741582, abs=1e-6)


def test_on_demand_interval_is_clamped_and_checkpoints_still_cost() -> None:
    # Λ = 4 · 1.6e-4; Young's τ = √(2 · (1/60) / 6.4e-4) = 7.2 h > 2 h: clamped to 2 h.
    # overhead = (1/60)/2 + 6.4e-4 · (1/6 + 1) = 0.0083333 + 0.0007467 = 0.0090800.
    est = costmodel.estimate(127.68, 24, 4, costmodel.ON_DEMAND_HAZARD_PER_HOUR, R_10M, C_60S)
    assert est.interval_hours == pytest.approx(2.0)
    assert est.hours == pytest.approx(24 * 1.00908, abs=1e-4)
    assert est.cost == pytest.approx(127.68 * 24 * 1.00908, abs=0.01)


def test_no_hazard_and_free_checkpoints_hit_the_bounds() -> None:
    lower, upper = costmodel.interval_bounds(C_60S)
    assert (lower, upper) == (pytest.approx(300 / 3600), pytest.approx(2.0))
    assert costmodel.checkpoint_interval(C_60S, 0.0) == upper
    assert costmodel.checkpoint_interval(0.0, 0.2) == pytest.approx(300 / 3600)
    no_risk = costmodel.estimate(10.0, 5, 2, 0.0, R_10M, 0.0)
    assert (no_risk.hours, no_risk.cost, no_risk.preemptions) == (5, 50, 0)


def test_slow_checkpoints_widen_the_bounds() -> None:
    # A 3-hour checkpoint cannot be taken every 2 hours: both bounds become C.
    assert costmodel.interval_bounds(3.0) == (3.0, 3.0)
    assert costmodel.checkpoint_interval(3.0, 5.0) == 3.0


def test_measured_hazards_by_region_then_cloud_then_default() -> None:
    # aws us-east-2: 1,055 preemptions in 3,198.82 node-h, weighed against the rest of aws
    # (2,911 in 4,830.36, itself weighed against the default) as 50 node-h of evidence.
    rest = (2911 + 0.491 * 50) / (4830.36 + 50)
    assert costmodel.spot_hazard("AWS", "us-east-2") == pytest.approx(
        (1055 + rest * 50) / (3198.82 + 50)
    )
    assert costmodel.spot_hazard("aws", "us-east-2") == pytest.approx(0.334, abs=1e-3)
    assert costmodel.spot_hazard("aws", "eu-west-1") == pytest.approx(0.494, abs=1e-3)
    assert costmodel.spot_hazard("aws") == costmodel.spot_hazard("aws", "eu-west-1")
    # gcp: one 2-day trace without a preemption moves it half way from the default, not to 0.
    assert costmodel.spot_hazard("gcp", "us-central1") == pytest.approx(0.491 * 50 / 95.62)
    assert costmodel.spot_hazard("runpod") == costmodel.DEFAULT_SPOT_HAZARD_PER_HOUR == 0.491
    assert "no trace of azure" in costmodel.spot_hazard_at("azure", "eastus")[1]
    assert costmodel.spot_hazard("aws") / 1000 > costmodel.ON_DEMAND_HAZARD_PER_HOUR


def test_hazard_precedence_and_sources(tmp_path: Path) -> None:
    body = {"metadata": {"gap_seconds": 3600, "cloud": "aws", "region": "us-east-2"}}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(body | {"data": [1] * 200}))  # 200 node-h, no preemption
    evidence = trace_hazards.Evidence.of(trace_hazards.hazards_from_files([path]), "your traces")
    at = costmodel.spot_hazard_at
    measured = at("aws", "us-east-2")
    assert measured[1].startswith("traces, aws us-east-2: 1,055 preemptions")
    mine = at("aws", "us-east-2", evidence=evidence)
    assert mine == (pytest.approx(measured[0] * 50 / 250), "your traces, aws us-east-2: "
                    "0 preemptions in 200.0 node-h")  # fmt: skip
    # Elsewhere in aws the user's trace is the cloud's evidence; gcp keeps the measured.
    assert at("aws", "eu-west-1", evidence=evidence)[1].startswith("your traces, aws:")
    assert at("gcp", "us-east4", evidence=evidence) == at("gcp", "us-east4")
    learned = at("aws", "us-east-2", per_cloud={"aws": 0.3}, learned=frozenset({"aws"}))
    assert learned == (0.3, costmodel.LEARNED)
    both = at("aws", "us-east-2", evidence=evidence, per_cloud={"aws": 0.3})
    assert both[0] == pytest.approx(0.3 * 50 / 250)  # your traces, weighed against the learned
    assert at("aws", "us-east-2", preemption_rate=0.01, evidence=evidence) == (
        0.01,
        "--preemption-rate",
    )


hazards = st.floats(min_value=1e-5, max_value=2.0)
ckpt_hours = st.floats(min_value=1 / 3600, max_value=0.5)
recovery = st.floats(min_value=0.0, max_value=2.0, allow_subnormal=False)
nodes = st.integers(min_value=1, max_value=64)
factor = st.floats(min_value=1.01, max_value=10.0)


def _cost(hazard: float, rec: float, ckpt: float, n: int = 4) -> float:
    return costmodel.estimate(10.0, 24.0, n, hazard, rec, ckpt).cost


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
    tau = costmodel.checkpoint_interval(ckpt, job_hazard)
    lower, upper = costmodel.interval_bounds(ckpt)
    other = lower + where * (upper - lower)
    best = costmodel.overhead(tau, ckpt, job_hazard, rec)
    assert best <= costmodel.overhead(other, ckpt, job_hazard, rec) + 1e-12
    for nudge in (0.999, 1.001):  # and is a local minimum, not just a bound
        near = min(upper, max(lower, tau * nudge))
        assert best <= costmodel.overhead(near, ckpt, job_hazard, rec) + 1e-12


@given(hazards, ckpt_hours)
def test_interval_is_young_daly_inside_the_bounds(job_hazard: float, ckpt: float) -> None:
    young = math.sqrt(2 * ckpt / job_hazard)
    lower, upper = costmodel.interval_bounds(ckpt)
    expected = min(upper, max(lower, young))
    assert costmodel.checkpoint_interval(ckpt, job_hazard) == pytest.approx(expected)


@given(hazards, recovery, ckpt_hours, nodes)
def test_expected_preemptions_are_hazard_times_hours(
    hazard: float, rec: float, ckpt: float, n: int
) -> None:
    est = costmodel.estimate(3.0, 10.0, n, hazard, rec, ckpt)
    assert est.preemptions == pytest.approx(n * hazard * est.hours)
    assert est.hours >= 10.0
    assert est.cost == pytest.approx(3.0 * est.hours)


# --- --learn: observed preemptions blended with the priors -------------------------------------


def test_blend_by_hand() -> None:
    # (n + λ₀·H₀) / (h + H₀) with λ₀ = 0.05, H₀ = 50: the docstring's examples.
    assert costmodel.LEARN_PRIOR_NODE_HOURS == 50.0
    assert costmodel.blend_hazard(0.05, 1, 4.0) == pytest.approx(3.5 / 54)
    assert costmodel.blend_hazard(0.05, 30, 200.0) == pytest.approx(0.13)
    assert costmodel.blend_hazard(0.05, 0, 0.0) == 0.05  # no data: the prior
    assert costmodel.blend_hazard(0.05, 3, 10.0, prior_node_hours=0) == pytest.approx(0.3)


@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=0, max_value=1000),
    st.floats(min_value=0.01, max_value=1e5),
)
def test_blend_lies_between_prior_and_observation(prior: float, n: int, hours: float) -> None:
    blended = costmodel.blend_hazard(prior, n, hours)
    low, high = sorted((prior, n / hours))
    assert low - 1e-12 <= blended <= high + 1e-12
    # More of the same observation pulls the blend towards it.
    more = costmodel.blend_hazard(prior, 10 * n, 10 * hours)
    assert abs(more - n / hours) <= abs(blended - n / hours) + 1e-12


def test_learn_hazards_weights_and_skips_local() -> None:
    observed = {
        "AWS": (0.5, 20, 40.0),
        "local": (1.0, 10, 10.0),  # simulated nodes on this machine teach nothing
        "runpod": (0.0, 0, 150.0),
    }
    learned = {h.cloud: h for h in costmodel.learn_hazards(observed)}
    assert set(learned) == {"aws", "runpod"}
    aws = learned["aws"]
    prior = costmodel.spot_hazard("aws")  # the measured hazard, by cloud
    assert (aws.prior, aws.preemptions, aws.node_hours, aws.observed) == (prior, 20, 40.0, 0.5)
    assert aws.weight == pytest.approx(40 / 90)
    assert aws.hazard == pytest.approx((20 + prior * 50) / 90)
    runpod = learned["runpod"]  # 150 quiet node-hours: the default prior drops to a quarter
    assert runpod.hazard == pytest.approx(costmodel.DEFAULT_SPOT_HAZARD_PER_HOUR * 50 / 200)


@pytest.mark.catalog  # checks accelerator names against the catalog
def test_request_hazard_precedence() -> None:
    learned = costmodel.learn_hazards({"aws": (0.5, 20, 40.0)})
    gpus = Accelerator.parse("H100:8")
    request = plan.PlanRequest.build(accelerator=gpus, learned=learned)
    blended = learned[0].hazard
    assert request.hazards == {"aws": pytest.approx(blended)}
    assert request.spot_hazard("AWS", "us-east-1") == pytest.approx(blended)  # beats measured
    assert request.spot_hazard_at("aws", "us-east-1")[1] == costmodel.LEARNED
    assert request.spot_hazard("gcp") == costmodel.spot_hazard("gcp")
    explicit = plan.PlanRequest.build(accelerator=gpus, learned=learned, hazards={"aws": 0.2})
    assert explicit.spot_hazard("aws") == 0.2  # an explicit per-cloud hazard beats a learned one
    everywhere = plan.PlanRequest.build(accelerator=gpus, learned=learned, preemption_rate=0.01)
    assert everywhere.spot_hazard("aws") == everywhere.spot_hazard("gcp") == 0.01
    with pytest.raises(SpecError, match="negative"):
        plan.PlanRequest.build(accelerator=gpus, hazards={"aws": -1.0})
