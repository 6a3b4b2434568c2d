"""`mncloud down` returns when nothing of the run is left, whatever phase the run is in.

Each test stops a real local run (supervisor, torchrun, the example script) at one phase:
starting, training, saving, finishing, waiting to relaunch after a preemption, and under a
deadline controller; then it checks the process table (psutil over every process of the
machine): no process carries the run's tag (nodes, the supervisor, which is tagged too), the
supervisor's pid is gone, its metadata server's port is closed, and for a deadline run the
controller and its keeper are gone. Training stops are graceful by default: the ranks get a
preemption notice and save the step they reached (a COMPLETE checkpoint, though the periodic
interval never came).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from mncloud import constants, control
from mncloud.backends.base import RunState
from mncloud.backends.local.chaos import _staging_steps
from mncloud.backends.local.processes import listener_pid, pid_alive, tagged_pids
from mncloud.cli import app
from mncloud.layout import run_dir
from mncloud.storage import CheckpointStore
from tests.test_local import EXAMPLE, cli, run_log, state_of, steps_since, up, wait_until

pytestmark = [pytest.mark.catalog]
runner = CliRunner()
NODES = ["--nodes", "2", "--gpus", "cpu:1"]


def _metadata_port(token: str) -> int | None:
    """The port of the run's metadata server, from a node's environment."""
    for pid in tagged_pids(token):
        try:
            url = psutil.Process(pid).environ().get(constants.METADATA_URL_ENV, "")
        except psutil.Error:
            continue
        if url:
            return int(url.split(":")[2].split("/")[0])
    return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tag(proc: psutil.Process) -> str:
    try:
        return proc.environ().get(constants.LOCAL_NODE_TAG_ENV, "")
    except psutil.Error:
        return ""


def assert_nothing_left(name: str, token: str, *pids: int | None, port: int | None = None) -> None:
    """No process of the run runs: none tagged, none of `pids`, no metadata server."""
    mine = os.getpid()
    tagged = [
        p.pid for p in psutil.process_iter()
        if p.pid != mine and _running(p) and _tag(p).startswith(f"{token}/")
    ]  # fmt: skip
    assert tagged == [], (name, tagged)
    assert [p for p in pids if p and pid_alive(p)] == [], (name, pids)
    if port is not None:
        assert listener_pid(port) is None, f"{name}: the metadata server still listens"
    assert state_of(name).state.is_final


def down(name: str, *flags: str) -> dict[str, Any]:
    result = runner.invoke(app, ["down", name, "--yes", "--json", *flags])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _wait_steps(name: str, at_least: int, timeout: float = 180) -> int:
    def reached() -> int:
        step = max(steps_since(name, 0), default=0)
        return step if step >= at_least else 0

    return int(wait_until(reached, timeout, f"{name} at step {at_least}"))


# --------------------------------------------------------------------------- fast


def test_down_takes_yes_now_and_grace_and_refuses_a_bad_grace() -> None:
    for flags in (["--yes"], ["-y", "--now"], ["--grace", "5s"]):
        result = runner.invoke(app, ["down", "nosuchrun", *flags])
        assert "No such option" not in result.output, result.output
        assert result.exit_code == 2 and "nosuchrun" in result.stderr
    bad = runner.invoke(app, ["down", "nosuchrun", "--grace", "soon"])
    assert bad.exit_code == 2 and "--grace 'soon'" in bad.stderr


# --------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_down_while_starting() -> None:
    up("starting", EXAMPLE, *NODES, script_args=["--steps", "100000"])
    state = state_of("starting")  # right after `up --detach`: nodes starting, no step yet
    assert state.state in (RunState.STARTING, RunState.RUNNING)
    result = down("starting")
    assert result["state"] == "CANCELLED"
    assert_nothing_left("starting", state.token, state.supervisor_pid)


@pytest.mark.slow
def test_down_while_training_saves_the_step_reached() -> None:
    """No periodic checkpoint ever (interval 10000): the notice's save is the only one."""
    up("train", EXAMPLE, *NODES, script_args=["--steps", "100000", "--ckpt-interval", "10000"])
    reached = _wait_steps("train", 5)
    state = state_of("train")
    port = _metadata_port(state.token)
    result = down("train", "--grace", "60s")
    assert result["state"] == "CANCELLED", result
    assert "preemption notice" in result["detail"], result["detail"]
    assert_nothing_left("train", state.token, state.supervisor_pid, port=port)
    good, _ = CheckpointStore(state.ckpt_uri).candidates()
    assert good and good[0] >= reached, (good, reached, run_log("train"))
    log = run_log("train")
    assert f"all 2 ranks save step {good[0]}" in log and "exitcode  : 115" in log, log[-3000:]


@pytest.mark.slow
def test_down_while_saving() -> None:
    up("saving", EXAMPLE, *NODES, script_args=["--steps", "100000", "--ckpt-interval", "3"])
    _wait_steps("saving", 3)
    state = state_of("saving")
    wait_until(lambda: _staging_steps(run_dir("saving"), 1), 120, "a save in flight")
    result = down("saving")
    assert result["state"] == "CANCELLED"
    assert_nothing_left("saving", state.token, state.supervisor_pid)
    good, _ = CheckpointStore(state.ckpt_uri).candidates()
    assert good, run_log("saving")  # never a torn step: the newest listed is COMPLETE


@pytest.mark.slow
def test_down_while_finishing() -> None:
    up("ending", EXAMPLE, *NODES, script_args=["--steps", "20", "--ckpt-interval", "10"])
    _wait_steps("ending", 20)  # the last step: the nodes save, exit, the supervisor records
    state = state_of("ending")
    result = down("ending")
    assert result["state"] in ("SUCCEEDED", "CANCELLED")
    assert_nothing_left("ending", state.token, state.supervisor_pid)


@pytest.mark.slow
def test_down_while_waiting_to_relaunch_after_a_preemption() -> None:
    up("relaunch", EXAMPLE, *NODES, "--recovery-delay", "600s",
       script_args=["--steps", "100000", "--ckpt-interval", "5"])  # fmt: skip
    _wait_steps("relaunch", 2)
    state = state_of("relaunch")
    cli("chaos", "preempt", "relaunch", "--node", "1")
    wait_until(lambda: state_of("relaunch").state is RunState.RECOVERING, 60, "RECOVERING")
    result = down("relaunch")
    assert result["state"] == "CANCELLED"
    assert_nothing_left("relaunch", state.token, state.supervisor_pid)


@pytest.mark.slow
def test_down_now_kills_at_once_without_a_notice() -> None:
    up("now", EXAMPLE, *NODES, script_args=["--steps", "100000", "--ckpt-interval", "10000"])
    _wait_steps("now", 3)
    state = state_of("now")
    result = down("now", "--now")
    assert result["state"] == "CANCELLED" and "preemption notice" not in result["detail"]
    assert_nothing_left("now", state.token, state.supervisor_pid)
    good, _ = CheckpointStore(state.ckpt_uri).candidates()
    assert good == []  # nothing saved: --now throws the unsaved steps away, as asked


@pytest.mark.slow
def test_down_under_a_deadline_controller(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [2] * 200}))
    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", "dl", "--yes", *NODES,
            "--recovery", "gang", "--spot-trace", str(trace), "--time-scale", "12",
            "--deadline", "3h", "--hours", "1", "--recovery-minutes", "4", "--",
            "--steps", "100000", "--ckpt-interval", "10000"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    _wait_steps("dl", 3)
    ctl = control.load_state("dl")
    assert ctl.phase == "spot" and ctl.pid and ctl.keeper_pid
    state = state_of("dl")
    result = down("dl")
    assert result["state"] == "CANCELLED", result
    assert_nothing_left("dl", state.token, state.supervisor_pid, ctl.pid, ctl.keeper_pid)
    final = control.load_state("dl")
    assert final.phase == "stopped" and "checkpoint step" in final.detail, final.detail
    # `status` restarts no controller that `down` stopped.
    cli("status", "dl")
    assert not control.controller_running("dl")


@pytest.mark.slow
def test_down_under_node_recovery_stops_at_once(tmp_path: Path) -> None:
    """Under node recovery the ranks do not watch for a notice (a node told it goes is
    replaced): no node asked its metadata, so `down` does not wait out the notice."""
    pytest.importorskip("torchft")
    up("replicas", EXAMPLE, "--nodes", "2", "--gpus", "cpu:1", "--recovery", "node",
       script_args=["--steps", "100000", "--ckpt-interval", "10"])  # fmt: skip
    _wait_steps("replicas", 3)
    state = state_of("replicas")
    result = down("replicas", "--grace", "120s")
    assert result["state"] == "CANCELLED"
    assert "preemption notice" not in result["detail"], result["detail"]
    assert_nothing_left("replicas", state.token, state.supervisor_pid)
    took = float(result["detail"].split(" gone in ")[1].split("s")[0])
    assert took < 60, result["detail"]
