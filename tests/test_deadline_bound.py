"""bench/deadline_bound.py's model policy: the exact best policy for a known availability law."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from mncloud.deadline.policy import Job, make_policy
from mncloud.deadline.replay import optimum, replay

BENCH = Path(__file__).parents[1] / "bench"


def _bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("deadline_bound", BENCH / "deadline_bound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bound = _bench()
JOB = Job(
    nodes=2,
    gap_seconds=600,
    work_ticks=12,
    deadline_ticks=30,
    overhead_ticks=2,
    spot_price=1.0,
    on_demand_price=3.0,
)


def _chain(down: float, up: float, ages: int = 4):
    return bound.AgeChain(np.full(ages + 1, down), np.full(ages + 1, up), ages)


def _cost(job: Job, chain, avail: np.ndarray) -> tuple[float, bool]:
    result = replay(bound.ModelPolicy(job, chain, bound.solve(job, chain)), avail)
    return result.cost, result.met_deadline


def test_spot_that_never_ends_is_used_from_the_start() -> None:
    chain = _chain(down=0.5, up=1e-6)
    avail = np.ones(JOB.deadline_ticks, bool)
    cost, met = _cost(JOB, chain, avail)
    assert met and cost == pytest.approx(optimum(JOB, avail, [0])[0])


def test_no_spot_ever_costs_exactly_on_demand() -> None:
    chain = _chain(down=1e-6, up=0.5)
    cost, met = _cost(JOB, chain, np.zeros(JOB.deadline_ticks, bool))
    assert met and cost == pytest.approx(JOB.on_demand_cost())


def test_hazards_are_read_from_complete_runs() -> None:
    avail = np.array([1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], bool)  # first and last runs cut off
    down, up = bound.run_hazards(avail, ages=3)
    assert down[1] == pytest.approx(1 / 3) and down[2] == pytest.approx(1.0)  # gaps 2, 2, 1
    assert up[1] == pytest.approx(1e-6) and up[2] == pytest.approx(0.5)  # runs of 2 and 3
    assert up[3] == pytest.approx(1.0)  # ≥ 3 ticks: one end in one tick of exposure


def _sample(chain, ticks: int, rng: random.Random) -> np.ndarray:
    state = chain.state(rng.random() < 0.5, 1)
    out = []
    for _ in range(ticks):
        out.append(bool(chain.up[state]))
        ended = rng.random() < chain.end[state, 0]
        state = chain.flip[state] if ended else chain.older[state]
    return np.array(out)


def test_it_beats_greedy_and_adaptive_on_traces_drawn_from_its_law() -> None:
    """Minimising the expected cost exactly, it is never worse on average than any other
    policy on traces that follow the law it was solved for; and it meets every deadline."""
    ages = 6
    chain = bound.AgeChain(
        np.array([0, 0.5, 0.3, 0.2, 0.1, 0.1, 0.05]),  # gaps: long ones grow likelier to last
        np.array([0, 0.6, 0.4, 0.1, 0.05, 0.02, 0.02]),  # runs: half end within two ticks
        ages,
    )
    tables = bound.solve(JOB, chain)
    rng = random.Random(7)
    totals = {"model": 0.0, "greedy": 0.0, "adaptive": 0.0}
    for _ in range(300):
        avail = _sample(chain, JOB.deadline_ticks, rng)
        for name in totals:
            policy = (
                bound.ModelPolicy(JOB, chain, tables) if name == "model" else make_policy(name, JOB)
            )
            result = replay(policy, avail)
            assert result.met_deadline
            assert result.cost >= optimum(JOB, avail, [0])[0] - 1e-9
            totals[name] += result.cost
    assert totals["model"] < totals["greedy"]
    assert totals["model"] < totals["adaptive"]
