"""A local rehearsal's run time paced by its training (`control/pacing.py`, `--pace-steps`):
a new tick waits for the steps the model counted, on a clock the test moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import control
from mncloud.backends.base import RunState, RunStatus
from mncloud.cli import app
from mncloud.control.pacing import holds, run_seconds
from mncloud.deadline.policy import Mode
from mncloud.request import build_spec
from mncloud.spec import LaunchOptions

runner = CliRunner()
SCALE = 12.0
TICK_WALL = 60 / SCALE  # a 60 s tick in wall seconds


def _state(tmp_path: Path, pace_steps: int | None) -> control.ControlState:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [2] * 30}))
    spec = build_spec(script, gpus="cpu:1", nodes=2, cloud=["local"], name="paced")
    state = control.deadline_state(
        spec, LaunchOptions(hours=0.15, recovery_minutes=4), deadline_s=18 * 60,
        hours_given=True, spot_trace=trace, time_scale=SCALE, pace_steps=pace_steps,
    )  # fmt: skip
    assert state.config.gap_s == 60
    state.started_at = 1000.0
    return state


def _running() -> RunStatus:
    return RunStatus(name="paced", backend="local", state=RunState.RUNNING, nodes=2)


def test_a_tick_waits_for_the_steps_the_model_counted(tmp_path: Path) -> None:
    state = _state(tmp_path, pace_steps=600)
    assert state.config.pace_step_s == pytest.approx(0.15 * 3600 / 600)  # 0.9 s a step
    state.mode, state.last_tick, state.model_work_ticks = Mode.SPOT, 4, 1
    steps = 40  # a slow machine: 40 of the 66.7 steps a tick is worth

    def work() -> int:
        return int(steps * state.config.pace_step_s // state.config.gap_s)

    now = 1000.0 + 5.3 * TICK_WALL  # tick 5 began on the wall clock
    assert holds(state, now, _running(), work)
    assert run_seconds(state, now) == 5 * 60  # held at tick 5's start
    now += 30.0  # six ticks of wall time: run time stays
    assert holds(state, now, _running(), work) and run_seconds(state, now) == 5 * 60
    steps = 80  # the training did the tick of work
    assert not holds(state, now, _running(), work)
    assert run_seconds(state, now) == pytest.approx(5 * 60)  # it goes on from where it was
    assert run_seconds(state, now + TICK_WALL) == pytest.approx(6 * 60)
    assert state.held_s == pytest.approx(0.3 * TICK_WALL + 30.0)


def test_nothing_holds_without_training_or_pacing(tmp_path: Path) -> None:
    paced = _state(tmp_path, pace_steps=600)
    paced.mode, paced.last_tick, paced.model_work_ticks = Mode.SPOT, 4, 3
    now = 1000.0 + 5.5 * TICK_WALL
    assert not holds(paced, now, None, lambda: 0)  # the launch ended: nothing to wait for
    waiting = RunStatus(name="paced", backend="local", state=RunState.RECOVERING, nodes=2)
    assert not holds(paced, now, waiting, lambda: 0)
    plain = _state(tmp_path, pace_steps=None)
    plain.mode, plain.last_tick, plain.model_work_ticks = Mode.SPOT, 4, 3
    assert not holds(plain, now, _running(), lambda: 0)
    assert run_seconds(plain, now) == pytest.approx(5.5 * 60)  # wall time × the scale


def test_pace_steps_is_for_a_local_deadline_rehearsal(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    base = ["up", str(script), "--gpus", "cpu:1", "--name", "dl", "--yes", "--hours", "1"]
    aws = ["--cloud", "aws", "--bucket", "s3://team-ckpt"]
    for flags, expected in [
        (["--cloud", "local", "--pace-steps", "100"], "need --deadline"),
        ([*aws, "--deadline", "2h", "--pace-steps", "100"], "--pace-steps is for --cloud local"),
        (["--cloud", "local", "--deadline", "2h", "--pace-steps", "0"],
         "--pace-steps 0: it must be greater than 0"),
        (["--cloud", "local", "--deadline", "2h", "--pace-steps", "9", "--budget", "5"],
         "--budget with --pace-steps"),
    ]:  # fmt: skip
        result = runner.invoke(app, [*base, *flags])
        assert result.exit_code == 2, result.output
        assert expected in result.stderr and "Traceback" not in result.output
