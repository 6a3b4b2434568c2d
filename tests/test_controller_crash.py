"""A deadline controller that dies is resumed from its journaled state, with no second launch.

Two layers: the controller's own recovery, deterministic, with a crash injected right after a
launch or in the middle of a switch (a real local launch of a sleeping script, real run
records); and end to end, a real controller `kill -9`ed mid-run and once during a switch,
restarted by its keeper, the run finishing by its deadline with one launch per decision.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import control
from mncloud.backends.local.backend import LocalBackend
from mncloud.cli import app
from mncloud.control.loop import Controller
from mncloud.deadline.policy import Mode
from mncloud.launch import launch
from mncloud.layout import control_log
from mncloud.plan.traces import load_trace
from mncloud.records.store import list_records
from mncloud.request import build_spec
from mncloud.spec.launch import LaunchOptions
from tests.test_local import EXAMPLE, run_log, wait_until

pytestmark = [pytest.mark.catalog]
runner = CliRunner()


class Crash(Exception):
    """The controller dies here (no `except` in the loop catches it)."""


def _controller_launches(name: str) -> list[Any]:
    return [
        e for r in list_records(name) for e in r.events
        if e.kind == "launch" and e.detail.startswith("deadline controller")
    ]  # fmt: skip


def _sleepy_state(tmp_path: Path, trace: list[int]) -> control.ControlState:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    script = tmp_path / "sleepy.py"
    script.write_text("import time\ntime.sleep(600)\n")
    spec = build_spec(script, gpus="cpu:1", nodes=2, cloud=["local"], name="crash")
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": trace}))
    state = control.deadline_state(
        spec, LaunchOptions(hours=1, recovery_minutes=4), deadline_s=3 * 3600,
        hours_given=True, spot_trace=path, time_scale=12,
    )  # fmt: skip
    control.save_state(state)
    return state


def _resume(tmp_path: Path, **kw: Any) -> Controller:
    state = control.load_state("crash")
    trace = load_trace(tmp_path / "trace.json")
    return Controller(state, control.TraceMarket(trace, 2), **kw)


@pytest.mark.slow
def test_a_controller_dead_right_after_a_launch_adopts_it(tmp_path: Path) -> None:
    state = _sleepy_state(tmp_path, [2] * 100)

    def launched_then_crash(*args: Any, **kw: Any) -> Any:
        launch(*args, **kw)
        raise Crash  # the launch is made; the controller dies before it records it

    ctl = Controller(state, control.TraceMarket(load_trace(tmp_path / "trace.json"), 2),
                     launcher=launched_then_crash)  # fmt: skip
    try:
        with pytest.raises(Crash):
            ctl.run()
        saved = control.load_state("crash")
        assert saved.launching is not None and saved.run_ids == []

        calls: list[Any] = []
        again = _resume(tmp_path, launcher=lambda *a, **k: calls.append(a))
        again._recover()
        assert calls == []  # no second launch
        assert again.state.launching is None and again.state.market is Mode.SPOT
        assert len(again.state.run_ids) == 1 and again.state.last_tick == 0
        assert [r.run_id for r in list_records("crash")] == again.state.run_ids
        assert len(_controller_launches("crash")) == 1
        assert LocalBackend().status("crash").state.value in ("STARTING", "RUNNING")
    finally:
        LocalBackend().down("crash")


@pytest.mark.slow
def test_a_controller_dead_during_a_switch_switches_once(tmp_path: Path) -> None:
    state = _sleepy_state(tmp_path, [2] * 100)
    ctl = Controller(state, control.TraceMarket(load_trace(tmp_path / "trace.json"), 2))
    try:
        ctl.step()  # tick 0: spot
        control.save_state(state)
        assert state.market is Mode.SPOT and len(state.run_ids) == 1

        class DiesInDown(LocalBackend):
            def down(self, run_name: str, **kw: Any) -> Any:
                super().down(run_name, **kw)
                raise Crash  # the spot launch is down; the on-demand one not yet made

        ctl.backend = DiesInDown()
        with pytest.raises(Crash):
            ctl._apply(Mode.ON_DEMAND, 1, "test switch", state.decisions[-1].model_copy(
                update={"tick": 1, "chose": Mode.ON_DEMAND}))  # fmt: skip
        saved = control.load_state("crash")
        assert saved.closing is not None and saved.launching is not None

        again = _resume(tmp_path)
        again._recover()
        st = again.state
        assert st.closing is None and st.launching is None and st.market is Mode.ON_DEMAND
        assert len(st.run_ids) == 2 and st.switches == 1
        assert len(_controller_launches("crash")) == 2  # spot, then on-demand: once each
        assert LocalBackend().status("crash").state.value in ("STARTING", "RUNNING")
    finally:
        LocalBackend().down("crash")


def _kill(pid: int | None) -> None:
    assert pid
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_kill_9_mid_run_and_during_a_switch_still_meets_the_deadline(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [2] * 5 + [0] * 60}))
    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", "dl", "--yes", "--nodes", "2",
            "--gpus", "cpu:2", "--recovery", "gang", "--spot-trace", str(trace),
            "--time-scale", "12", "--spot-price", "1", "--on-demand-price", "3",
            "--recovery-minutes", "4", "--deadline", "18m", "--hours", "0.15",
            "--pace-steps", "300", "--",  # run time paced by the 300 steps: any machine
            "--steps", "300", "--ckpt-interval", "10", "--log-every", "100",
            # Steps of known length (≥ 30 s in all): the run cannot finish on spot before
            # the trace takes it away at 25 s, however fast the machine. Few of them: the
            # controller's death and restart, not the training, is what this run proves
            # (its dead time is run time: the deadline's slack pays for it at `--time-scale`
            # 12, as tests/test_control_local.py's faster clock might not).
            "--compute-ms", "100"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0

    def on_spot() -> control.ControlState | None:
        s = control.load_state("dl")
        return s if s.phase == "spot" and s.last_tick >= 1 else None

    spot = wait_until(on_spot, 240, "spot")  # a bound on a hang only: a slow start is fine
    _kill(spot.pid)  # mid-run, on spot
    # Tick 5 (the switch) waits for the steps of the ticks before it: long on a slow machine.
    switching = wait_until(lambda: (s := control.load_state("dl")).launching and s, 480,
                           "a switch under way")  # fmt: skip
    _kill(switching.pid)  # during the switch to on-demand
    state = wait_until(lambda: (s := control.load_state("dl")).final and s, 900, "the end")
    assert state.phase == "finished", (state.detail, run_log("dl"))
    assert "deadline 0.3 h met" in state.detail and state.resumes >= 2, state.detail
    # One launch per decision: every record of the name is a launch the state knows, each
    # with the controller's launch event once.
    records = list_records("dl")
    assert [r.run_id for r in records] == state.run_ids
    assert len(_controller_launches("dl")) == len(state.run_ids) == state.switches + 1
    assert "restarting it from its state" in control_log("dl").read_text()


def test_the_keeper_gives_up_only_on_a_crash_loop() -> None:
    """Twenty quick deaths in a row end the keeping; a controller that ran a while before it
    was killed starts the count over, so a week-long run is always kept."""
    from mncloud.control.keeper import HEALTHY_S, MAX_RESTARTS, restarts_after

    count = 0
    for _ in range(MAX_RESTARTS):
        count = restarts_after(count, lived_s=2.0)
    assert count == MAX_RESTARTS  # the next quick death is one too many
    assert restarts_after(count, lived_s=2.0) > MAX_RESTARTS
    assert restarts_after(count, lived_s=HEALTHY_S) == 1
