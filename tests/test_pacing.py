"""A local rehearsal's run time paced by its training (`control/pacing.py`, `--pace-steps`):
a new tick waits for the steps the model counted, on a clock the test moves."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import control
from mncloud.backends.base import RunState, RunStatus
from mncloud.cli import app
from mncloud.control import loop
from mncloud.control.loop import Controller
from mncloud.control.pacing import holds, run_seconds
from mncloud.deadline.policy import Mode
from mncloud.plan.traces import load_trace
from mncloud.request import build_spec
from mncloud.spec.launch import LaunchOptions
from tests.test_control import FakeClock

runner = CliRunner()
SCALE = 12.0
TICK_WALL = 60 / SCALE  # a 60 s tick in wall seconds


def _state(
    tmp_path: Path, pace_steps: int | None, trace_data: list[int] | None = None
) -> control.ControlState:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    trace = tmp_path / "trace.json"
    data = trace_data or [2] * 30
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": data}))
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


# ------------------------------------------------- the controller on a simulated machine


class Machine:
    """A local backend whose training runs at a chosen speed on the test's clock: a launch call
    takes `launch_s`, training starts `startup_s` after it, then does `steps_per_s` steps a
    wall second, checkpointing every `CKPT` steps; a launch taken away resumes from the newest
    checkpoint."""

    name, runs_here, records_own_events = "local", True, True
    CKPT, TOTAL = 20, 600

    def __init__(
        self, clock: FakeClock, steps_per_s: float, startup_s: float, launch_s: float
    ) -> None:
        self.clock, self.rate, self.startup_s = clock, steps_per_s, startup_s
        self.launch_s = launch_s
        self.launched_at: float | None = None
        self.saved = 0  # the newest complete checkpoint step
        self.preemptions = 0

    def step(self) -> int:
        if self.launched_at is None:
            return self.saved
        trained = max(0.0, self.clock.now - self.launched_at - self.startup_s) * self.rate
        return min(self.TOTAL, self.saved + int(trained))

    def checkpoint(self) -> int:
        step = self.step()
        return step if step == self.TOTAL else step // self.CKPT * self.CKPT

    def launch(self, spec: Any, options: Any, **_kw: Any) -> Any:
        self.clock.now += self.launch_s
        self.launched_at = self.clock.now
        return SimpleNamespace(run_id=None, prepared=SimpleNamespace(plan=None),
                               status=self.status("paced"))  # fmt: skip

    def status(self, name: str) -> RunStatus:
        if self.launched_at is None:
            state = RunState.CANCELLED
        else:
            state = RunState.SUCCEEDED if self.step() == self.TOTAL else RunState.RUNNING
        return RunStatus(name=name, backend="local", state=state, nodes=2,
                         preemptions=self.preemptions)  # fmt: skip

    def take_node(self, name: str, node: int, by: str = "") -> None:
        self.preemptions += 1

    def down(self, name: str, notice_s: float = 0.0, **_kw: Any) -> RunStatus:
        self.clock.now += notice_s  # the notice passes; the ranks save the step they reached
        self.saved, self.launched_at = self.step(), None
        return self.status(name)


def _rehearse(
    tmp_path: Path, steps_per_s: float, startup_s: float, launch_s: float, paced: bool
) -> Any:
    """test_control_local's rehearsal on a simulated machine: spot for 5 ticks, then none; the
    controller's progress read off the machine's checkpoints."""
    state = _state(tmp_path, 600 if paced else None, trace_data=[2] * 5 + [0] * 60)
    market = control.TraceMarket(load_trace(Path(state.config.trace or "")), 2)
    clock = FakeClock()
    machine = Machine(clock, steps_per_s, startup_s, launch_s)

    def checkpoint_step(st: Any) -> int:
        st.ckpt_step = machine.checkpoint()
        return int(st.ckpt_step)

    ctl = Controller(state, market, clock=clock, backend=machine, launcher=machine.launch)  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "checkpoint_step", checkpoint_step)
        state.started_at = None
        return ctl.run()


@pytest.mark.parametrize(
    ("steps_per_s", "startup_s", "launch_s"), [(15, 3, 1), (4, 30, 10), (1.5, 60, 60)]
)  # fmt: skip
def test_a_paced_rehearsal_meets_the_deadline_at_any_speed(
    tmp_path: Path, steps_per_s: float, startup_s: float, launch_s: float
) -> None:
    """Fast (a tick's 66.7 steps in 4.4 s), slow (17 s) and very slow (44 s, and a minute in
    each launch call; a tick is 5 s): the same story, and the deadline met in run time."""
    state = _rehearse(tmp_path, steps_per_s, startup_s, launch_s, paced=True)
    assert state.phase == "finished" and "deadline 0.3 h met" in state.detail, state.detail
    chosen = [d.chose for d in state.decisions]
    assert chosen[0] is Mode.SPOT and Mode.ON_DEMAND in chosen and state.preemptions == 1
    switch = next(d for d in state.decisions if d.chose is Mode.ON_DEMAND)
    assert switch.tick == 5 and state.decisions[-1].tick < 18, state.decisions
    if steps_per_s < 5:  # the clock waited for the training
        assert state.held_s > 0


def test_unpaced_a_slow_machine_misses_the_scaled_deadline(tmp_path: Path) -> None:
    """Why pacing: run time at wall time × the scale outruns a slow machine's steps."""
    state = _rehearse(tmp_path, 1.5, 60.0, 60.0, paced=False)
    assert state.phase == "finished" and "MISSED" in state.detail, state.detail
