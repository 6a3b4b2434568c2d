"""The deadline policies: tick arithmetic, the safety net, and the decisions they make."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mncloud.deadline.policy import (
    DEFAULT_POLICY,
    POLICIES,
    Job,
    Mode,
    Observation,
    Policy,
    make_policy,
    ticks_ceil,
    ticks_floor,
)
from mncloud.deadline.replay import optimum, replay
from mncloud.errors import SpecError


def _job(work: int = 6, deadline: int = 12, overhead: int = 1, nodes: int = 1) -> Job:
    return Job(nodes, 3600, work, deadline, overhead, spot_price=1.0, on_demand_price=3.0)


def _avail(pattern: str) -> np.ndarray:
    return np.array([c == "1" for c in pattern])


def test_ticks_are_whole_second_arithmetic() -> None:
    assert ticks_ceil(12 * 3600, 300) == 144
    assert ticks_ceil(0.1 * 3 * 3600, 300) == 4  # 1080 s → 3.6 ticks → 4, float noise ignored
    assert ticks_floor(30 * 3600, 300) == 360
    assert ticks_ceil(600, 195) == 4
    assert ticks_floor(599.9999999, 600) == 1


def test_job_build_counts_ticks_and_refuses_impossible_deadlines() -> None:
    job = Job.build(
        nodes=4,
        hours=20,
        deadline_s=30 * 3600,
        overhead_s=600,
        gap_s=300,
        spot_price=0.918,
        on_demand_price=3.06,
    )
    assert (job.work_ticks, job.deadline_ticks, job.overhead_ticks) == (240, 360, 2)
    assert job.on_demand_cost() == pytest.approx(4 * 3.06 * (20 + 10 / 60))
    with pytest.raises(SpecError, match="positive"):
        Job.build(
            nodes=1, hours=1, deadline_s=0, overhead_s=0, gap_s=60, spot_price=1, on_demand_price=2
        )
    with pytest.raises(SpecError, match=r"earliest feasible deadline is 20\.1667 h"):
        Job.build(
            nodes=1,
            hours=20,
            deadline_s=20 * 3600,
            overhead_s=600,
            gap_s=300,
            spot_price=1,
            on_demand_price=2,
        )


def test_registry_has_the_three_named_policies_and_ours_by_default() -> None:
    assert {"on-demand", "greedy", DEFAULT_POLICY} <= set(POLICIES)
    for name, cls in POLICIES.items():
        assert cls.name == name and cls.__doc__ and "Events" in cls.__doc__
    with pytest.raises(SpecError, match="unknown policy 'nope'"):
        make_policy("nope", _job())


def test_on_demand_costs_exactly_the_baseline() -> None:
    job = _job()
    result = replay(make_policy("on-demand", job), _avail("1" * 12))
    assert result.cost == job.on_demand_cost() == 7 * 3.0
    assert result.finished_hours == 7 and result.spot_hours == 0


def test_greedy_uses_spot_waits_in_gaps_and_counts_preemptions() -> None:
    job = _job(work=4, deadline=12, overhead=1)
    result = replay(make_policy("greedy", job), _avail("111001111111"))
    # launch (overhead), 2 work, preempted at tick 3, wait, relaunch at 5 (overhead), 2 work
    assert result.preemptions == 1 and result.switches == 0
    assert result.spot_hours == 6 and result.idle_hours == 2 and result.finished_hours == 8
    assert result.cost == 6 * 1.0


def test_safety_net_goes_on_demand_while_one_restart_still_fits() -> None:
    job = _job(work=4, deadline=6, overhead=1)
    result = replay(make_policy("greedy", job), _avail("000000"))
    assert result.met_deadline and result.finished_hours == 6  # waited 1 tick, then 1 + 4
    assert result.on_demand_hours == 5 and result.idle_hours == 1


class _Spy(Policy):
    name = "spy"

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.seen: list[Observation] = []

    def decide(self, obs: Observation) -> Mode:
        self.seen.append(obs)
        return Mode.ON_DEMAND


def test_a_policy_sees_the_past_and_present_only() -> None:
    spy = _Spy(_job())
    replay(spy, _avail("101100111111"))
    for obs in spy.seen:
        assert len(obs.history) == obs.tick + 1
        assert obs.history[-1] == obs.spot_now
        with pytest.raises(IndexError):
            obs.history[obs.tick + 1]
    assert list(spy.seen[3].history) == [True, False, True, True]


def _random_case(rng: random.Random) -> tuple[Job, np.ndarray]:
    deadline = rng.randint(6, 40)
    overhead = rng.randint(0, 3)
    work = rng.randint(1, deadline - overhead)
    p = rng.choice([0.2, 0.5, 0.8])
    stay = rng.choice([0.5, 0.9])
    avail, on = [], rng.random() < p
    for _ in range(deadline):
        avail.append(on)
        on = on if rng.random() < stay else rng.random() < p
    return _job(work, deadline, overhead, nodes=rng.randint(1, 3)), np.array(avail)


def test_no_policy_misses_a_deadline_or_beats_the_optimum() -> None:
    rng = random.Random(7)
    for _ in range(300):
        job, avail = _random_case(rng)
        best = optimum(job, avail, [0])[0]
        for name in POLICIES:
            result = replay(make_policy(name, job), avail)
            assert result.met_deadline, (name, job, avail)
            assert result.cost >= best - 1e-9, (name, job, avail)


def test_ours_returns_from_on_demand_to_spot_once_spot_looks_lasting() -> None:
    job = Job(
        1,
        300,
        work_ticks=100,
        deadline_ticks=130,
        overhead_ticks=2,
        spot_price=1.0,
        on_demand_price=3.0,
    )
    avail = _avail("0" * 40 + "1" * 90)
    result = replay(make_policy(DEFAULT_POLICY, job), avail)
    greedy = replay(make_policy("greedy", job), avail)
    assert result.met_deadline and result.switches >= 1 and result.spot_hours > 0
    assert result.cost < greedy.cost


def test_uniform_progress_keeps_on_demand_while_spot_is_away() -> None:
    # behind the line at tick 1 → on-demand; ahead of it later, yet it stays (the paper's rule:
    # leaving on-demand to wait would cost a relaunch when it falls behind again)
    job = _job(work=6, deadline=12, overhead=1)
    result = replay(make_policy("uniform-progress", job), _avail("0" * 12))
    assert result.met_deadline and result.idle_hours == 1 and result.on_demand_hours == 7
    assert result.switches == 0
