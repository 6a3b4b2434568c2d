"""Deadline mode across places: the K-place optimum against brute force, K = 1 against the
single-place replay and optimum, every policy against the optimum, and `mncloud replay` with
several traces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from mncloud.cli import replay as replay_cli
from mncloud.deadline.places import (
    PLACE_POLICIES,
    Choice,
    Place,
    PlacesJob,
    PlacesObservation,
    PlacesPolicy,
    make_places_policy,
)
from mncloud.deadline.policy import Job, Mode, make_policy
from mncloud.deadline.replay import optimum, replay
from mncloud.deadline.replay_places import optimum_places, replay_places
from tests.test_replay import TRACES, needs_traces
from tests.test_replay_cli import KEYS
from tests.test_replay_cli import _run as run

ZONES = TRACES / "availability" / "1-node" / "aws-02-15-2023"
PLACE_KEYS = ["spot_hours_by_place", "spot_cost_by_place", "moves", "launch_cost"]


class _Script(PlacesPolicy):
    """Plays a fixed sequence of choices, one per tick."""

    name = "script"

    def __init__(self, pjob: PlacesJob, seq: tuple[Choice, ...]) -> None:
        self.pjob, self.seq = pjob, seq

    def decide(self, obs: PlacesObservation) -> Choice:
        return self.seq[obs.tick]


def _brute_force(pjob: PlacesJob, avail: np.ndarray) -> float:
    """The least cost over every sequence of choices (spot only where there is capacity),
    each replayed in the tick model."""
    d = pjob.job.deadline_ticks
    anywhere = [Choice(Mode.NONE), Choice(Mode.ON_DEMAND)]
    per_tick = [
        anywhere + [Choice(Mode.SPOT, p) for p in range(pjob.k) if avail[p, t]] for t in range(d)
    ]
    best = np.inf
    for seq in itertools.product(*per_tick):
        result = replay_places(_Script(pjob, seq), avail)
        if result.met_deadline:
            best = min(best, result.cost)
    return best


def _case(rng: np.random.Generator, k: int, longest: int) -> tuple[PlacesJob, np.ndarray]:
    """A small random job over k places: prices, egress, overhead, work, deadline ≤ longest."""
    overhead, work = int(rng.integers(0, 3)), int(rng.integers(1, 5))
    deadline = min(longest, work + overhead + int(rng.integers(0, 4)))
    job = Job(1, 3600, work, max(deadline, work + overhead), overhead, 0.3, 1.0)
    places = tuple(
        Place(f"p{p}", float(rng.choice([0.2, 0.3, 0.5])), float(rng.choice([0, 0, 0.4])))
        for p in range(k)
    )
    return PlacesJob(job, places), rng.random((k, job.deadline_ticks)) < 0.6


@pytest.mark.slow
@pytest.mark.parametrize(("k", "longest", "cases"), [(1, 8, 80), (2, 7, 80), (3, 6, 60)])
def test_optimum_equals_brute_force_on_small_cases(k: int, longest: int, cases: int) -> None:
    rng = np.random.default_rng(k)
    for _ in range(cases):
        pjob, avail = _case(rng, k, longest)
        found = optimum_places(pjob, avail, [0])[0]
        assert found == pytest.approx(_brute_force(pjob, avail)), (pjob, avail.astype(int))


def _bursty(rng: np.random.Generator, k: int, ticks: int) -> np.ndarray:
    """Availability in runs (up and down spells of 1–12 ticks), one row per place."""
    rows = []
    for _ in range(k):
        row: list[bool] = []
        up = bool(rng.random() < 0.5)
        while len(row) < ticks:
            row += [up] * int(rng.integers(1, 13))
            up = not up
        rows.append(row[:ticks])
    return np.array(rows)


def test_one_place_is_the_single_place_model() -> None:
    """K = 1 without egress: the same optimum, and each policy the same run, as one trace."""
    rng = np.random.default_rng(7)
    for _ in range(12):
        work, overhead = int(rng.integers(3, 20)), int(rng.integers(0, 4))
        deadline = work + overhead + int(rng.integers(0, 25))
        job = Job(2, 300, work, deadline, overhead, float(rng.choice([0.3, 0.9])), 3.06)
        pjob = PlacesJob(job, (Place("only", job.spot_price),))
        avail = _bursty(rng, 1, deadline + 60)
        starts = [0, 17, 60]
        assert optimum_places(pjob, avail, starts) == pytest.approx(optimum(job, avail[0], starts))
        for name, start in itertools.product(PLACE_POLICIES, starts):
            many = replay_places(make_places_policy(name, pjob), avail, start)
            one = replay(make_policy(name, job), avail[0], start)
            assert many.cost == pytest.approx(one.cost), name
            assert (many.met_deadline, many.switches, many.preemptions, many.moves) == (
                one.met_deadline,
                one.switches,
                one.preemptions,
                0,
            ), name


def test_no_policy_misses_a_deadline_or_beats_the_optimum() -> None:
    rng = np.random.default_rng(11)
    for _ in range(10):
        k = int(rng.integers(2, 5))
        work, overhead = int(rng.integers(5, 40)), int(rng.integers(0, 4))
        deadline = work + overhead + int(rng.integers(0, 40))
        job = Job(1, 300, work, deadline, overhead, 0.9, 3.06)
        places = tuple(
            Place(f"p{p}", float(rng.uniform(0.3, 1.2)), float(rng.choice([0.0, 0.05])))
            for p in range(k)
        )
        pjob = PlacesJob(job, places)
        avail = _bursty(rng, k, deadline + 100)
        starts = [0, 33, 100]
        best = optimum_places(pjob, avail, starts)
        for name in PLACE_POLICIES:
            for start, least in zip(starts, best, strict=True):
                result = replay_places(make_places_policy(name, pjob), avail, start)
                assert result.met_deadline, (name, start)
                assert result.cost >= least - 1e-9, (name, start)
                by_place = sum(result.spot_cost_by_place or [])
                od = result.on_demand_hours * job.on_demand_price
                assert result.cost == pytest.approx(by_place + od + result.launch_cost)


# --------------------------------------------------------------------------- the CLI

JOB = ("--hours", "12", "--deadline", "24h", "--restart-overhead", "390s")


@pytest.fixture(autouse=True)
def narrow_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_cli, "console", Console(width=80))


def _zones(*names: str) -> list[str]:
    return [str(ZONES / f"{n}_v100_1.json") for n in names]


def _trace(tmp_path: Path, name: str, data: list[int], gap: int = 300) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return str(path)


@needs_traces
def test_two_zones_json_per_place_and_per_trace_price() -> None:
    code, out, err = run(
        *_zones("us-east-1a", "us-east-1c"), *JOB, "--every", "240h", "--json",
        "--spot-price", "0.9", "--spot-price", "0.45",
    )  # fmt: skip
    assert code == 0 and err == "", err
    windows = json.loads(out)
    assert [w["start_hours"] for w in windows] == pytest.approx([0, 240, 480, 720, 960], abs=0.2)
    for w in windows:
        assert list(w) == [*KEYS, *PLACE_KEYS, "places", "optimum_cost"]
        assert w["places"] == ["us-east-1a_v100_1", "us-east-1c_v100_1"] and w["met_deadline"]
        assert w["cost"] >= w["optimum_cost"] - 1e-3
        hours, costs = w["spot_hours_by_place"], w["spot_cost_by_place"]
        assert sum(hours) == pytest.approx(w["spot_hours"], abs=1e-3)
        assert costs == pytest.approx([0.9 * hours[0], 0.45 * hours[1]], abs=1e-3)
    assert sum(w["spot_hours_by_place"][1] for w in windows) > 0


@needs_traces
def test_two_zones_table_fits_80_columns_with_places_and_summary() -> None:
    code, out, err = run(*_zones("us-east-1a", "us-east-1d"), *JOB, "--every", "120h")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "opt $" in out and "us-east-1d_v100_1" in out and "× the optimum across places" in out
    assert "deadlines missed: 0" in out.splitlines()[-1]


def test_common_span_is_said_once_and_json_stays_clean(tmp_path: Path) -> None:
    a = _trace(tmp_path, "a", [1, 0] * 300)
    b = _trace(tmp_path, "b", [0, 1] * 200)
    code, out, err = run(a, b, a, "--hours", "2", "--deadline", "6h", "--every", "6h", "--json")
    assert code == 0, err
    assert err.count("\n") == 1 and "common span, the first 33.33 h (400 ticks)" in err
    windows = json.loads(out)
    assert len(windows) == 5 and windows[0]["places"] == ["a", "b", "a-2"]


@pytest.mark.parametrize(
    ("gaps", "prices", "message"),
    [
        ((300, 60), (), "share gap_seconds: a (300 s), b (60 s)"),
        ((300, 300), ("1", "2", "3"), "--spot-price given 3 times for 2 trace(s)"),
        ((300,), ("1", "2"), "--spot-price given 2 times for 1 trace(s)"),
        ((300, 300), ("1", "-1"), "--spot-price -1: it must be greater than or equal to 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, gaps: tuple[int, ...], prices: tuple[str, ...], message: str
) -> None:
    traces = [_trace(tmp_path, "ab"[i], [1] * 400, gap) for i, gap in enumerate(gaps)]
    flags = [x for p in prices for x in ("--spot-price", p)]
    code, out, err = run(*traces, "--hours", "2", "--deadline", "6h", *flags)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
