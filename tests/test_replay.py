"""Replay over traces: loading and validation, windows, the offline optimum, hazards."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from mncloud.deadline.policy import DEFAULT_POLICY, Job, Mode, Observation, Policy, make_policy
from mncloud.deadline.replay import optimum, replay, window_starts
from mncloud.errors import SpecError
from mncloud.plan import hazards
from mncloud.plan.traces import load_trace

TRACES = Path(__file__).parents[1].parent / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no spot traces at {TRACES}")


def _write(tmp_path: Path, body: object, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


class _Script(Policy):
    name = "script"

    def __init__(self, job: Job, seq: tuple[Mode, ...]) -> None:
        super().__init__(job)
        self.seq = seq

    def decide(self, obs: Observation) -> Mode:
        return self.seq[obs.tick]


def _brute_force(job: Job, avail: np.ndarray) -> float:
    """The least cost over every sequence of modes, each replayed in the tick model."""
    best = np.inf
    for seq in itertools.product(list(Mode), repeat=job.deadline_ticks):
        if any(m is Mode.SPOT and not avail[i] for i, m in enumerate(seq)):
            continue
        result = replay(_Script(job, seq), avail)
        if result.met_deadline:
            best = min(best, result.cost)
    return best


def test_optimum_equals_brute_force_on_small_cases() -> None:
    rng = random.Random(1)
    for _ in range(40):
        deadline, overhead = rng.randint(3, 7), rng.randint(0, 2)
        work = rng.randint(1, max(1, deadline - overhead))
        if work + overhead > deadline:
            continue
        job = Job(rng.randint(1, 2), 1800, work, deadline, overhead, 1.0, 3.0)
        avail = np.array([rng.random() < 0.6 for _ in range(deadline)])
        assert optimum(job, avail, [0])[0] == pytest.approx(_brute_force(job, avail))


def test_optimum_over_many_windows_at_once_matches_one_by_one() -> None:
    rng = np.random.default_rng(3)
    avail = rng.random(400) < 0.5
    job = Job(2, 300, 30, 60, 2, 1.0, 3.3)
    starts = [0, 37, 100, 340]
    together = optimum(job, avail, starts)
    for start, value in zip(starts, together, strict=True):
        assert optimum(job, avail, [start])[0] == pytest.approx(value)


def test_load_trace_names_the_bad_field(tmp_path: Path) -> None:
    ok = load_trace(_write(tmp_path, {"metadata": {"gap_seconds": 300}, "data": [0, 4, 16]}))
    assert ok.gap == 300 and ok.available(4).tolist() == [False, True, True]
    cases = {
        "metadata.gap_seconds": {"metadata": {}, "data": [1]},
        "data.2": {"metadata": {"gap_seconds": 60}, "data": [1, 0, "x"]},
        "data: ": {"metadata": {"gap_seconds": 60}, "data": []},
        "metadata: ": {"data": [1]},
    }
    for field, body in cases.items():
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            load_trace(_write(tmp_path, body))
    with pytest.raises(SpecError, match="gap_seconds"):
        load_trace(_write(tmp_path, {"metadata": {"gap_seconds": 0}, "data": [1]}))
    with pytest.raises(SpecError, match="not JSON"):
        load_trace(_write(tmp_path, "{nope"))
    with pytest.raises(SpecError, match="no such file"):
        load_trace(tmp_path / "absent.json")


def test_windows_fit_in_the_trace(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, {"metadata": {"gap_seconds": 3600}, "data": [1] * 100}))
    job = Job(1, 3600, 10, 30, 1, 1.0, 3.0)
    assert window_starts(trace, job, None, 48 * 3600) == [48]
    assert window_starts(trace, job, 24 * 3600) == [0, 24, 48]
    with pytest.raises(SpecError, match="longer than the trace"):
        window_starts(trace, job, 200 * 3600)
    with pytest.raises(SpecError, match="does not fit"):
        window_starts(trace, job, None, 80 * 3600)


@needs_traces
def test_hazard_constants_are_what_the_traces_say() -> None:
    measured = hazards.hazards_from_files(sorted(TRACES.rglob("*.json")))
    assert hazards.pooled(measured) == hazards.TRACE_HAZARD_PER_HOUR
    assert hazards.pooled(measured, by_region=True) == hazards.TRACE_REGION_HAZARD_PER_HOUR
    assert {h.kind for h in measured} == {"preemption", "availability"}
    assert hazards.spot_hazard("aws", "us-east-2") == 0.33
    assert hazards.spot_hazard("aws", "eu-west-1") == hazards.TRACE_HAZARD_PER_HOUR["aws"]
    assert hazards.spot_hazard("lambda") is None


def test_hazards_from_a_users_trace_use_its_metadata(tmp_path: Path) -> None:
    body = {
        "metadata": {"gap_seconds": 3600, "cloud": "gcp", "region": "europe-west4"},
        "data": [4, 4, 2, 4, 4, 0, 0, 4],
    }
    [item] = hazards.hazards_from_files([_write(tmp_path, body, "mine.json")])
    assert (item.cloud, item.region, item.preemptions, item.node_hours) == (
        "gcp",
        "europe-west4",
        6,
        22.0,
    )
    assert item.hazard == pytest.approx(6.5 / 22)


@needs_traces
def test_the_issues_example_meets_every_deadline_and_saves_overall() -> None:
    trace = load_trace(TRACES / "availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json")
    job = Job.build(
        nodes=4,
        hours=20,
        deadline_s=30 * 3600,
        overhead_s=600,
        gap_s=trace.gap,
        spot_price=0.918,
        on_demand_price=3.06,
    )
    avail = trace.available(4)
    starts = window_starts(trace, job, 24 * 3600)
    best = optimum(job, avail, starts)
    results = [replay(make_policy(DEFAULT_POLICY, job), avail, s) for s in starts]
    for result, least in zip(results, best, strict=True):
        assert result.met_deadline and result.cost >= least - 1e-9
    assert sum(r.cost for r in results) < 0.7 * sum(r.on_demand_cost for r in results)
