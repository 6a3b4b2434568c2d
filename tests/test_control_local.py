"""Deadline mode live on the local backend, end to end: real controller process, supervisor,
torchrun and checkpoints; spot capacity from a small synthetic trace, time-compressed.

Each test waits on the controller's own state file (bounded polls).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import control
from mncloud.backends.local.figures import read_final
from mncloud.cli import app
from mncloud.layout import local_ckpt_dir
from mncloud.records.ledger import cost_summary
from mncloud.records.store import find_record
from tests.reference import start_reference
from tests.test_local import EXAMPLE, run_log, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.catalog]
runner = CliRunner()
NODES = ["--nodes", "2", "--gpus", "cpu:2", "--recovery", "gang"]
SCALE = 24  # a 60 s tick of the trace passes in 2.5 s
# Long enough that the trace's spot capacity goes away mid-training: steps of known length
# (≥ 15 s in all), so a fast machine cannot finish on spot before the trace takes it at 12.5 s.
TRAIN = ["--steps", "300", "--ckpt-interval", "10", "--log-every", "100", "--compute-ms", "50"]
# The nodes' preflight (a few seconds a launch on 2 cores) is not what these runs prove:
# tests/test_controller_crash.py's rehearsal keeps it.
QUICK_START = ["--no-preflight"]
# Run time paced by the training (`control/pacing.py`): `--hours` is TRAIN's 300 steps, and a
# tick of work passes only when its steps are done, so a slow machine meets the deadline too.
PACED = ["--pace-steps", "300"]


def _trace(folder: Path, data: list[int]) -> Path:
    path = folder / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": data}))
    return path


def _deadline_up(name: str, trace: Path, *flags: str, steps: list[str]) -> None:
    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", name, "--yes", *NODES,
            "--spot-trace", str(trace), "--time-scale", str(SCALE), "--spot-price", "1",
            "--on-demand-price", "3", "--recovery-minutes", "4", *QUICK_START, *flags, "--",
            *steps]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "deadline controller started" in result.stdout


def _wait_controller(name: str, timeout: float) -> control.ControlState:
    state = wait_until(
        lambda: (s := control.load_state(name)).final and s, timeout, f"{name}'s controller"
    )
    assert isinstance(state, control.ControlState)
    return state


def _ledgers(state: control.ControlState) -> list[Any]:
    return [cost_summary(find_record(run_id)) for run_id in state.run_ids]


def test_spot_lost_then_on_demand_meets_the_deadline_with_the_same_weights(
    tmp_path: Path,
) -> None:
    """Spot for 5 ticks, then none: preempted, switched to on-demand, done by the deadline."""
    trace = _trace(tmp_path, [2] * 5 + [0] * 60)
    # The uninterrupted run beside this one: its load only slows the training, which the
    # paced run time waits for (`--pace-steps`).
    uninterrupted = start_reference(EXAMPLE, NODES, TRAIN)
    _deadline_up("dl", trace, "--deadline", "18m", "--hours", "0.15", *PACED, steps=TRAIN)
    state = _wait_controller("dl", 900)  # a bound on a hang only: slow is fine
    assert state.phase == "finished", (state.detail, run_log("dl"))
    assert "deadline 0.3 h met" in state.detail, state.detail
    assert state.preemptions >= 1 and state.switches >= 1
    chosen = [d.chose.value for d in state.decisions]
    assert chosen[0] == "spot" and "on-demand" in chosen
    # The switch came after the trace took spot away (tick 5), and every decision fell
    # before the deadline's tick (18 ticks of 60 s), in run time, however slow the machine.
    switch = next(d for d in state.decisions if d.chose.value == "on-demand")
    assert switch.tick >= 5 and state.decisions[-1].tick < 18, state.decisions

    ledgers = _ledgers(state)
    assert sum(s.spot for s in ledgers) > 0 and sum(s.on_demand for s in ledgers) > 0
    assert state.spot_cost == pytest.approx(sum(s.spot for s in ledgers), rel=0.05)
    assert ledgers[0].preemptions >= 1  # the trace's preemption, recorded by the supervisor
    record = find_record(state.run_ids[-1])
    launch = next(e for e in record.events if "deadline controller" in e.detail)
    assert "switch to on-demand" in launch.detail and launch.spot is False
    status = json.loads(runner.invoke(app, ["status", "dl", "--json"]).stdout)[0]
    assert status["state"] == "SUCCEEDED" and status["deadline"]["mode"] == "finished"
    assert status["deadline"]["on_demand_cost"] > 0 and status["deadline"]["preemptions"] >= 1

    reference, final = uninterrupted(), read_final(f"file://{local_ckpt_dir('dl')}")
    assert reference and final and final["weights_sha256"] == reference["weights_sha256"]


def test_budget_stops_the_run_cleanly_and_keeps_its_checkpoint(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [2] * 200)
    # A checkpoint every 5 steps: the first comes early in the budget's wall time.
    long_run = ["--steps", "100000", "--ckpt-interval", "5", "--log-every", "1000"]
    # 2 nodes × $1/h of run time: $0.033 a tick; the budget lasts ~9 ticks (22.5 s).
    _deadline_up("pay", trace, "--deadline", "3h", "--hours", "1", "--budget", "0.3",
                 steps=long_run)  # fmt: skip
    state = _wait_controller("pay", 240)
    assert state.phase == "stopped" and "budget $0.30" in state.detail, state.detail
    # Stopped within the budget, and not before its last tick: a stop comes when the next
    # tick ($0.033) and the stop's notice (at most a tick's) would cross it.
    assert 0.3 - 3 * 2 * 60 / 3600 < state.cost <= 0.3 + 1e-6, state.cost
    status = json.loads(runner.invoke(app, ["status", "pay", "--json"]).stdout)[0]
    assert status["state"] == "CANCELLED" and "budget" in status["detail"]
    # The newest complete checkpoint is kept and named; the budget is wall time here, so a
    # machine too slow to save one within the budget's 22.5 s keeps none and says nothing.
    step = status["ckpt_step"]
    kept = f"checkpoint step {step} kept"
    assert (kept in state.detail) if step else ("kept" not in state.detail), state.detail


def test_a_node_lost_while_spot_is_offered_is_launched_again(tmp_path: Path) -> None:
    """A spot node killed outside the trace (spot still offered): the held gang is taken as
    preempted and launched again on spot from its checkpoint, and the run finishes."""
    trace = _trace(tmp_path, [2] * 200)
    # No tick here waits on the training (spot throughout, the deadline far): few steps, each
    # ≥ 60 ms so that a fast machine cannot end the run between its first checkpoint (step 10)
    # and the kill: 90 steps, ≥ 5.4 s.
    quick = ["--steps", "100", "--ckpt-interval", "10", "--log-every", "50", "--compute-ms", "60"]
    _deadline_up("held", trace, "--deadline", "2h", "--hours", "0.2", steps=quick)
    first = wait_until(lambda: (s := control.load_state("held")).run_ids and s, 120, "a launch")
    wait_until(lambda: any(local_ckpt_dir("held").rglob("COMPLETE")), 120, "a checkpoint")
    killed = runner.invoke(app, ["chaos", "preempt", "held", "--node", "1"])
    assert killed.exit_code == 0, killed.output
    state = _wait_controller("held", 240)
    assert state.phase == "finished", (state.detail, run_log("held"))
    assert state.preemptions >= 1 and len(state.run_ids) >= 2, state.run_ids
    assert state.run_ids[0] == first.run_ids[0]
    assert all(d.chose.value == "spot" for d in state.decisions), state.decisions
    relaunch = find_record(state.run_ids[1])
    assert any("deadline controller" in e.detail for e in relaunch.events)
