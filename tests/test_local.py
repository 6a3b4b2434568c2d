"""The local backend end to end: real supervisor, real torchrun, real SIGKILLs.

The slow tests launch runs with `mncloud up --detach` and wait on the run's own state and
telemetry (bounded polls, no sleeps standing in for events).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from mncloud import constants
from mncloud.backends.base import RunState
from mncloud.backends.local.backend import tail_lines
from mncloud.backends.local.figures import read_final, read_run_series, recovery_figures
from mncloud.backends.local.processes import kill_tagged, pid_alive, tagged_pids
from mncloud.backends.local.state import LocalState, load_state
from mncloud.cli import app
from mncloud.layout import run_dir
from mncloud.telemetry.series import Series, SeriesWriter

pytestmark = pytest.mark.catalog
runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
# Small enough for seconds of training on 2 cores, long enough to preempt in the middle.
TRAIN_ARGS = ["--steps", "150", "--ckpt-interval", "10", "--log-every", "50"]


def cli(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"mncloud {' '.join(args)}: {result.output}"
    return result


def up(name: str, script: Path, *flags: str, script_args: list[str] | None = None) -> None:
    """`mncloud up --detach`; gang recovery unless the flags say otherwise (these tests are
    about whole-gang relaunches; tests/test_node_recovery.py covers node recovery)."""
    recovery = [] if "--recovery" in flags else ["--recovery", "gang"]
    args = ["up", str(script), "--cloud", "local", "--name", name, "--detach", "--yes", *flags,
            *recovery]  # fmt: skip
    cli(*args, "--", *(script_args or []))


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def state_of(name: str) -> LocalState:
    return load_state(run_dir(name))


def wait_final(name: str, timeout: float = 240) -> LocalState:
    state = wait_until(
        lambda: (s := state_of(name)).state.is_final and s, timeout, f"{name} to end"
    )
    assert isinstance(state, LocalState)
    return state


def run_series(name: str) -> Series:
    """The run's telemetry segments, as its figures read them."""
    return read_run_series(run_dir(name))


def steps_since(name: str, t0: float) -> list[int]:
    """Rank 0's steps since `t0`."""
    return [r.step for r in run_series(name).steps if r.rank == 0 and r.t >= t0]


def run_log(name: str) -> str:
    return (run_dir(name) / "run.log").read_text()


def _tag(proc: psutil.Process) -> str:
    try:
        return proc.environ().get(constants.LOCAL_NODE_TAG_ENV, "")
    except psutil.Error:
        return ""


def _is_running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --------------------------------------------------------------------------- fast


def _three_sleeps(pids: list[int]) -> list[int] | None:
    names = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            names.append(psutil.Process(pid).name())
    return pids if len(pids) == 4 and names.count("sleep") == 3 else None


def test_kill_tagged_finds_processes_in_their_own_sessions(tmp_path: Path) -> None:
    """A node's processes are found by their tag, even in new sessions and reparented."""
    env = dict(os.environ, **{constants.LOCAL_NODE_TAG_ENV: "tok/1"})
    script = "sleep 60 & setsid sleep 60 & (sleep 60 &) ; wait"
    proc = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    try:
        # bash and its three sleeps (the subshell of `(sleep 60 &)` is tagged too until it
        # exits: wait for the three sleeps, not for any four processes).
        pids = wait_until(lambda: _three_sleeps(tagged_pids("tok", 1)), 10, "4 processes")
        assert tagged_pids("tok", 0) == [] and tagged_pids("tok") == pids
        killed = kill_tagged("tok", 1)
        assert set(pids) <= set(killed)
        proc.wait(timeout=10)
        wait_until(lambda: not any(pid_alive(p) for p in pids), 10, "all dead")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def write_attempts(folder: Path, attempts: list[list[dict[str, Any]]]) -> None:
    """A local run folder's launch.json and, per attempt, rank 0's telemetry: a line with
    `event` is an event, any other a step."""
    from mncloud.backends.local.state import LocalLaunch, save_launch, series_uri

    launch = LocalLaunch(
        name="r", token="t", task_id="x", num_nodes=2, procs_per_node=1, master_port=1,
        ckpt_uri=f"file://{folder.parent / 'ckpt'}", workdir=str(folder), run="true",
    )  # fmt: skip
    save_launch(folder, launch)
    uri = series_uri(folder)
    assert uri is not None
    for k, lines in enumerate(attempts):
        writer = SeriesWriter(uri, 0, node=0, background=False, launch=f"attempt-{k}")
        for line in lines:
            writer.add({"k": "event" if "event" in line else "step", **line})
        assert writer.flush()


def test_recovery_figures_from_events_and_telemetry(tmp_path: Path) -> None:
    from mncloud.backends.local.state import Event, save_state

    folder = tmp_path / "run"
    folder.mkdir()
    state = LocalState(
        name="r", token="t", num_nodes=2, procs_per_node=1, master_port=1, task_id="x",
        ckpt_uri=f"file://{tmp_path / 'ckpt'}", restarts=1, preemptions=1, started_at=90.0,
        ended_at=200.0,
        events=[
            Event(t=100.0, kind="launch", message=""),
            Event(t=130.0, kind="chaos-preempt", message=""),
            Event(t=130.5, kind="preempted", message=""),
            Event(t=133.0, kind="launch", message=""),
        ],
    )  # fmt: skip
    save_state(folder, state)
    first = [{"t": 110.0, "event": "start", "resumed_from": 0}]
    first += [{"t": 111.0 + s, "step": s} for s in range(1, 15)]  # steps 1..14 before the kill
    second = [{"t": 143.0, "event": "start", "resumed_from": 10}]
    second += [{"t": 144.0 + s, "step": 10 + s} for s in range(1, 11)]
    write_attempts(folder, [first, second])
    fig = recovery_figures(folder)
    assert fig.attempts == 2 and fig.resumed_from == [0, 10]
    assert fig.steps_lost == 4 and fig.lost_per_recovery == [4]
    assert fig.cold_start_s == 12.0  # launch at 100, first step at 112
    assert fig.resume_s == [15.0]  # preempted at 130, first resumed step at 145
    assert fig.wall_s == 110.0


def test_tail_lines_reads_and_stops(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text("a\nb\npartial")
    assert list(tail_lines(path, follow=False, done=lambda: True)) == ["a", "b", "partial"]
    assert list(tail_lines(path, follow=True, done=lambda: True)) == ["a", "b", "partial"]


def test_summary_is_readable_at_80_columns() -> None:
    """Every row of the demo summary fits 80 columns, or wraps inside its value column:
    never under the label, never in the middle of a parenthesis."""
    import io

    from rich.console import Console

    from mncloud.backends.local.figures import (
        RecoveryFigures,
        ReferenceResult,
        RunProgress,
    )
    from mncloud.cli.follow import reference_table, status_line, summary_table

    fig = RecoveryFigures(
        attempts=6, restarts=5, preemptions=3, outages=2, wall_s=12345.6, cold_start_s=123.4,
        resume_s=[101.5, 102.5, 103.5], steps_lost=150, lost_per_recovery=[50, 49, 51],
        final={"weights_sha256": "ab" * 32},
    )  # fmt: skip
    progress = RunProgress(
        name="a-run-with-a-rather-long-name", state=RunState.SUCCEEDED, ended=True, attempt=4,
        restarts=3, preemptions=3, step=100000, started_at=1.0, ended_at=12346.6,
        detail="after 3 restarts, 3 preemptions", figures=fig,
    )  # fmt: skip
    ref = ReferenceResult(state=RunState.SUCCEEDED, weights_sha256="ab" * 32, wall_s=4321.0,
                          detail="")  # fmt: skip
    out = io.StringIO()
    con = Console(file=out, width=80, color_system=None)
    for item in (status_line(progress), summary_table(progress), reference_table("ab" * 32, ref)):
        con.print(item)
    lines = out.getvalue().splitlines()
    assert lines and all(len(line) <= 80 for line in lines), lines
    for line in lines:
        assert line.count("(") == line.count(")"), line  # no parenthesis split over lines
        assert not line.startswith(" "), line  # no row wrapped under its label
    assert "SUCCEEDED succeeded" not in out.getvalue()
    assert "5 (3 preemptions, 2 storage outages)" in out.getvalue()
    assert "storage outage 2 relaunches waited for the bucket" in out.getvalue()
    assert any(line.startswith("reference") and "same final weights" in line for line in lines)


def test_chaos_needs_a_known_local_run() -> None:
    result = runner.invoke(app, ["chaos", "preempt", "nope"])
    assert result.exit_code == 2 and "no run named 'nope'" in result.output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_storage_outage_takes_its_marker_back(tmp_path: Path, sig: int) -> None:
    """`chaos storage-outage` stopped by SIGTERM or SIGHUP ends the outage as Ctrl-C does: the
    bucket's outage marker is gone, the end is in chaos.jsonl, the exit is 128 + the signal."""
    import sys

    from mncloud.backends.local.state import LocalLaunch, read_jsonl, save_launch
    from mncloud.backends.registry import record_backend
    from mncloud.storage import BucketURL

    name = f"outage-{signal.Signals(sig).name.lower()}"
    uri = f"file://{tmp_path / 'ckpt'}/{name}"
    folder = record_backend(name, "local")
    save_launch(folder, LocalLaunch(name=name, token="t", task_id="x", num_nodes=1,
                                    procs_per_node=1, master_port=1, ckpt_uri=uri,
                                    workdir=str(tmp_path), run="true"))  # fmt: skip
    marker = Path(BucketURL.parse(uri, check_name=False).name) / constants.STORAGE_OUTAGE_MARKER
    proc = subprocess.Popen(
        [sys.executable, "-m", "mncloud", "chaos", "storage-outage", name, "--seconds", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once the marker is down: the bucket is "down"
        assert "unreachable for 600s" in first and marker.exists(), first
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        proc.kill()
    assert not marker.exists()
    phases = [r.get("phase") for r in read_jsonl(folder / "chaos.jsonl")]
    assert phases == ["start", "end"]


def test_dryrun_checks_without_starting(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["up", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:2", "--nodes", "2",
              "--name", "dry", "--dryrun", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["state"] == "PENDING"
    assert not (run_dir("dry") / "state.json").exists()


# --------------------------------------------------------------------------- slow, end to end


@pytest.mark.slow
def test_preempted_twice_ends_with_the_uninterrupted_weights(s3_env: Any) -> None:
    """2 nodes × 2 processes: uninterrupted vs preempted twice (once during a save)."""
    from mncloud.storage import CheckpointStore
    from tests.reference import reference_final

    flags = ["--nodes", "2", "--gpus", "cpu:2", "--recovery-delay", "0.5s"]
    reference = reference_final(EXAMPLE, flags[:4], TRAIN_ARGS)  # shared with test_preempt
    assert reference["steps"] == 150

    bucket = s3_env.make_bucket()
    up("chaos", EXAMPLE, *flags, "--bucket", f"s3://{bucket}/exp", script_args=TRAIN_ARGS)
    # 1) node 1 dies while its ranks write the first checkpoint (step 10).
    cli("chaos", "preempt", "chaos", "--node", "1", "--during-save")
    # 2) node 0 (the rendezvous host) dies mid-training in the second attempt.
    wait_until(lambda: state_of("chaos").attempt == 2, 60, "attempt 2")
    launched = [e.t for e in state_of("chaos").events if e.kind == "launch"][-1]
    store = CheckpointStore(f"s3://{bucket}/exp/chaos")

    def checkpoint_behind_training() -> bool:
        good, _ = store.candidates()
        return bool(good) and max(steps_since("chaos", launched), default=0) > good[0] + 3

    wait_until(checkpoint_behind_training, 120, "a checkpoint in attempt 2, and steps past it")
    cli("chaos", "preempt", "chaos", "--node", "0")
    state = wait_final("chaos")
    assert state.state is RunState.SUCCEEDED, run_log("chaos")
    assert state.ckpt_uri == f"s3://{bucket}/exp/chaos"

    final = read_final(state.ckpt_uri)
    assert final is not None and final["weights_sha256"] == reference["weights_sha256"]
    assert (state.restarts, state.preemptions) == (2, 2)
    assert state.detail == "succeeded after 2 restarts, 2 preemptions"
    fig = recovery_figures(run_dir("chaos"))
    assert fig.attempts == 3
    saving = next(e for e in state.events if e.kind == "chaos-preempt").data["during_save_step"]
    assert saving == 10 and fig.resumed_from[1] < saving  # the torn step was not used
    failures = [e for e in state.events if e.kind == "preempted"]
    for k in range(1, 3):
        resumed, steps = fig.resumed_from[k], fig.steps_per_attempt[k]
        # Resumed from the newest checkpoint complete when the nodes went down.
        assert resumed == (failures[k - 1].data["latest_checkpoint"] or 0)
        # The previous attempt trained and the resume point moved on (its own telemetry may
        # lack its last steps: a SIGKILLed rank's unwritten segment is lost with it).
        assert fig.steps_per_attempt[k - 1] and resumed >= fig.resumed_from[k - 1]
        # Past the resume point each step is trained exactly once, in order.
        assert steps == list(range(resumed + 1, resumed + 1 + len(steps)))
    assert fig.resumed_from[2] > 0  # the second resume used a real checkpoint
    assert fig.steps_per_attempt[2][-1] == 150
    # Logs carry node and rank, across relaunches; `logs --node` filters.
    log = cli("logs", "chaos").output
    # Rank 0 (the only rank that prints here) is on node 0: the static rendezvous keeps node order.
    assert "[node 0 rank 0]" in log and "[node 1 rank 0]" not in log and "attempt 3" in log
    node1 = cli("logs", "chaos", "--node", "1").output.splitlines()
    assert node1 and all(line.startswith("[node 1") for line in node1)
    status = json.loads(cli("status", "chaos", "--json").output)[0]
    assert status["state"] == "SUCCEEDED" and status["restarts"] == 2


@pytest.mark.slow
def test_rank_0_runs_on_node_0(tmp_path: Path) -> None:
    """Global ranks follow node order (node 0: ranks 0-1, node 1: ranks 2-3), so rank 0's
    log lines, rank-0-only writes and the preflight's head are all on node 0."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname='ranks'\n")
    script = tmp_path / "ranks.py"
    script.write_text("import os\nprint('node', os.environ['SKYPILOT_NODE_RANK'], flush=True)\n")
    up("ranks", script, "--nodes", "2", "--gpus", "cpu:2")
    assert wait_final("ranks").state is RunState.SUCCEEDED, run_log("ranks")
    pairs = set(re.findall(r"\[node (\d) rank (\d)\] node (\d)", run_log("ranks")))
    assert pairs == {("0", "0", "0"), ("0", "1", "0"), ("1", "2", "1"), ("1", "3", "1")}


@pytest.mark.slow
def test_storage_outage_mid_run_is_survived() -> None:
    from mncloud.storage import CheckpointStore

    args = ["--steps", "1000", "--ckpt-interval", "20", "--log-every", "500"]
    up("outage", EXAMPLE, "--nodes", "2", "--gpus", "cpu:1", script_args=args)
    wait_until(lambda: len(steps_since("outage", 0)) >= 50, 120, "training to start")
    result = cli("chaos", "storage-outage", "outage", "--seconds", "2")
    assert "reachable again" in result.output
    step_after_outage = max(steps_since("outage", 0))
    state = wait_final("outage")
    assert state.state is RunState.SUCCEEDED, run_log("outage")
    assert state.restarts == 0
    kinds = [e.data.get("phase") for e in state.events if e.kind == "chaos-storage-outage"]
    assert kinds == ["start", "end"]
    log = run_log("outage")
    assert "simulated outage" in log  # the ranks did feel it
    # Saving resumed after the outage (not only the final save), up to the last step.
    committed = [int(n) for n in re.findall(r"checkpoint step (\d+) committed", log)]
    assert any(step_after_outage < n < 1000 for n in committed), (step_after_outage, committed)
    latest, _ = CheckpointStore(state.ckpt_uri).latest()
    assert latest == 1000


@pytest.mark.slow
def test_a_storage_outage_over_a_relaunch_is_waited_out_not_spent() -> None:
    """Issue #60: the bucket goes down, then a node is preempted: the relaunch's preflight
    finds the bucket unreachable (exit 75). The supervisor waits it out with a backoff, spends
    none of --max-restarts, names it in its events and the summary, and the run ends with the
    uninterrupted run's weights."""
    import sys

    from mncloud.backends.local.figures import progress_of
    from mncloud.cli.follow import summary_table
    from mncloud.storage import CheckpointStore
    from tests.reference import reference_final

    flags = ["--nodes", "2", "--gpus", "cpu:2", "--recovery-delay", "0.5s"]
    reference = reference_final(EXAMPLE, flags[:4], TRAIN_ARGS)  # shared with the test above
    up("outage2", EXAMPLE, *flags, "--max-restarts", "0", script_args=TRAIN_ARGS)
    store = CheckpointStore(state_of("outage2").ckpt_uri)

    def checkpoint_behind_training() -> bool:
        good, _ = store.candidates()
        return bool(good) and max(steps_since("outage2", 0), default=0) > good[0] + 3

    wait_until(checkpoint_behind_training, 120, "a checkpoint, and steps past it")
    # 20 s: the relaunch's preflight (its bucket check gives up after 5 s) starts well inside.
    outage = subprocess.Popen(
        [sys.executable, "-m", "mncloud", "chaos", "storage-outage", "outage2", "--seconds", "20"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert outage.stdout is not None and "unreachable" in outage.stdout.readline()
        cli("chaos", "preempt", "outage2", "--node", "1")
        assert outage.wait(timeout=60) == 0
    finally:
        outage.kill()
    state = wait_final("outage2")
    assert state.state is RunState.SUCCEEDED, run_log("outage2")
    final = read_final(state.ckpt_uri)
    assert final is not None and final["weights_sha256"] == reference["weights_sha256"]
    assert state.errors_retried == 0 and state.preemptions == 1 and state.outages >= 1
    assert state.restarts == 1 + state.outages
    outages = [e for e in state.events if e.kind == "outage"]
    assert len(outages) == state.outages
    assert all(set(e.data["exit_codes"].values()) <= {constants.STORAGE_OUTAGE_EXIT_CODE, None}
               for e in outages)  # fmt: skip
    log = run_log("outage2")
    assert "found its bucket unreachable (exit 75: a storage outage)" in log
    assert "newest complete checkpoint: unknown (the bucket does not answer)" in log
    assert "newest complete checkpoint: none" not in log  # there were some: it was not asked
    assert "(storage outage 1: backoff, not counted against --max-restarts)" in log
    assert state.detail.endswith(f", 1 preemption, {state.outages} storage outage" +
                                 ("s" if state.outages > 1 else ""))  # fmt: skip
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(
        summary_table(progress_of(run_dir("outage2"), summary=True))
    )
    summary = out.getvalue()
    assert "waited for the bucket; --max-restarts untouched" in summary
    assert f"(1 preemption, {state.outages} storage outage" in summary


@pytest.mark.slow
def test_down_leaves_no_process_behind(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='sleepy'\n")
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    up("sleepy", script, "--nodes", "2", "--gpus", "cpu:2")
    state = wait_until(lambda: (s := state_of("sleepy")).state is RunState.RUNNING and s, 60,
                       "RUNNING")  # fmt: skip
    # Each node: bash, torchrun and 2 workers (each in its own session).
    pids = wait_until(lambda: len(p := tagged_pids(state.token)) >= 8 and p, 60, "8 processes")
    supervisor = state.supervisor_pid
    result = json.loads(cli("down", "sleepy", "--json").output)
    # Right after `down` returns, no process of the run runs: not the supervisor, not one
    # process carrying the run's tag (psutil over every process of the machine).
    assert result["state"] == "CANCELLED"
    assert "process(es) of the run gone" in result["detail"], result["detail"]
    assert not pid_alive(supervisor)
    assert [p for p in pids if pid_alive(p)] == []
    running = [p for p in psutil.process_iter() if p.pid != os.getpid() and _is_running(p)]
    assert [p.pid for p in running if _tag(p).startswith(f"{state.token}/")] == []
    # Idempotent.
    assert json.loads(cli("down", "sleepy", "--json").output)["state"] == "CANCELLED"


def _start_event(name: str) -> dict[str, Any]:
    return next(e.data for e in run_series(name).events if e.event == "start")


@pytest.mark.slow
def test_same_name_is_refused_unless_resume_or_replace() -> None:
    """A second `up` of a name never silently replaces the first run or its checkpoints."""
    flags = ["--nodes", "1", "--gpus", "cpu:1"]
    args = ["--steps", "40", "--ckpt-interval", "10", "--log-every", "40"]
    up("again", EXAMPLE, *flags, script_args=args)
    assert wait_final("again").state is RunState.SUCCEEDED, run_log("again")
    base = ["up", str(EXAMPLE), "--cloud", "local", "--name", "again", "--detach", "--yes"]
    refused = runner.invoke(app, [*base, *flags, "--", *args])
    assert refused.exit_code == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "--replace" in lines[0]

    longer = ["--steps", "60", "--ckpt-interval", "10", "--log-every", "60"]
    up("again", EXAMPLE, *flags, "--resume", script_args=longer)
    assert wait_final("again").state is RunState.SUCCEEDED, run_log("again")
    assert _start_event("again")["resumed_from"] == 40  # the first run's newest checkpoint

    up("again", EXAMPLE, *flags, "--replace", script_args=args)
    assert wait_final("again").state is RunState.SUCCEEDED, run_log("again")
    assert _start_event("again")["resumed_from"] == 0  # a fresh start
    aside = list(run_dir("again").glob("checkpoints.replaced-*"))
    assert len(aside) == 1 and any(aside[0].iterdir())  # the old checkpoints kept, set aside
