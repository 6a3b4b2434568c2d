"""A `--budget` stop keeps what was paid for: before the run goes, its ranks get a preemption
notice and save the step they reached (a COMPLETE checkpoint), though the script's periodic
interval never came; the notice's own cost stays inside the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import control
from mncloud.cli import app
from mncloud.storage import CheckpointStore
from tests.test_local import EXAMPLE, run_log, steps_since, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.catalog]
runner = CliRunner()


def test_a_budget_stop_leaves_a_complete_checkpoint_of_the_step_reached(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [2] * 200}))
    # 2 nodes × $1/h of run time: $0.033 a tick (5 s); the budget lasts a few ticks.
    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", "pay", "--yes", "--nodes", "2",
            "--gpus", "cpu:1", "--recovery", "gang", "--spot-trace", str(trace),
            "--time-scale", "12", "--spot-price", "1", "--on-demand-price", "3",
            "--recovery-minutes", "1", "--deadline", "3h", "--hours", "1", "--budget", "0.25",
            "--", "--steps", "100000", "--ckpt-interval", "100000"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    state = wait_until(lambda: (s := control.load_state("pay")).final and s, 150, "the stop")
    assert state.phase == "stopped" and "budget $0.25" in state.detail, state.detail
    assert state.cost <= 0.25 + 1e-6
    reached = max(steps_since("pay", 0), default=0)
    assert reached > 0, run_log("pay")
    assert state.ckpt_uri is not None
    good, _ = CheckpointStore(state.ckpt_uri).candidates()
    # The periodic interval never came: the only checkpoint is the notice's, of the last step.
    assert good and good[0] >= reached - 1, (good, reached, run_log("pay")[-3000:])
    assert f"newest complete checkpoint step {good[0]} kept" in state.detail
    assert "preemption notice" in run_log("pay")
