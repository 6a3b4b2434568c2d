"""The soak of `bench/soak.py`, small: one fault of each kind on a 2×2 exact-mode run.

A node SIGKILLed, a preemption notice, a 5 s storage outage, a kill during a save, the
deadline controller `kill -9`ed, and `down` + `up --resume`, in a seeded random order, each
once the run trains again after the one before. The run must succeed with the weights of the
uninterrupted run, no failed checkpoint load, no checkpoint lost and no process left. The
driver is the benchmark's own `soak()` (one copy of the fault logic and of the goals), loaded
from bench/ as tests/test_deadline_bound.py loads its benchmark.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.catalog
BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("soak", BENCH / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


soak = _bench()


def test_draw_has_every_kind_and_is_seeded() -> None:
    plan = soak.draw(6, 3, soak.KINDS)
    assert sorted(f["kind"] for f in plan) == sorted(soak.KINDS)
    assert plan == soak.draw(6, 3, soak.KINDS) != soak.draw(6, 4, soak.KINDS)
    many = soak.draw(100, 3, soak.KINDS)
    assert set(f["kind"] for f in many) == set(soak.KINDS) and len(many) == 100
    assert all(5 <= f["seconds"] <= 30 and f["node"] in (0, 1) for f in many)


@pytest.mark.slow
def test_one_fault_of_each_kind_ends_with_the_uninterrupted_weights() -> None:
    result = soak.soak(len(soak.KINDS), seed=3, storage_s=(5, 5), reference_alongside=True)
    report = soak.report(result)
    assert result["by_kind"] == {k: 1 for k in soak.KINDS}, report
    assert result["state"] == "SUCCEEDED", report
    assert result["weights_equal"], report
    assert result["failed_loads"] == 0 and result["checkpoints_lost"] == 0, report
    assert result["processes_left"] == [], report
    assert result["goal_met"], report
