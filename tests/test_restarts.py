"""One restart meaning on every backend (issue #29): a preemption is always recovered and
counted apart; an error in the user's code is retried `--max-restarts` times.

The local runs are real: the supervisor, the nodes' processes, `mncloud chaos preempt`. The
script counts its own attempts in a file, so "fails N times, then succeeds" is its behaviour,
not a mock's; a preemption is a SIGKILL of the node while the script waits for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud.backends.base import RunState
from mncloud.cli import app
from tests.test_local import cli, run_log, up, wait_final, wait_until

runner = CliRunner()

SCRIPT = """\
import sys, time
from pathlib import Path

folder, fails, preempt = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
count = folder / "attempts"
attempt = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(attempt))
if preempt and attempt == 1:
    (folder / "waiting").write_text("1")
    time.sleep(300)  # the test preempts this attempt
    sys.exit(3)
if attempt - preempt <= fails:
    print(f"attempt {attempt}: failing on purpose", flush=True)
    sys.exit(1)
print(f"attempt {attempt}: done", flush=True)
"""


NOW = ("--recovery-delay", "0s")


def _script(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='flaky'\n")
    script = tmp_path / "flaky.py"
    script.write_text(SCRIPT)
    return script


def _launch(name: str, script: Path, folder: Path, fails: int, preempt: bool, *flags: str) -> None:
    """One node running the script itself (no torchrun), with `flags`."""
    folder.mkdir()
    args = [str(folder), str(fails), "1" if preempt else "0"]
    up(name, script, "--gpus", "cpu:1", "--launcher", "none", "--no-preflight",
       *flags, script_args=args)  # fmt: skip


@pytest.mark.catalog
@pytest.mark.slow
def test_errors_in_the_code_are_retried_max_restarts_times(tmp_path: Path) -> None:
    script = _script(tmp_path)
    _launch("enough", script, tmp_path / "a", 2, False, "--max-restarts", "2", *NOW)
    _launch("too-few", script, tmp_path / "b", 2, False, "--max-restarts", "1", *NOW)
    enough, too_few = wait_final("enough"), wait_final("too-few")
    assert enough.state is RunState.SUCCEEDED, run_log("enough")
    assert (enough.attempt, enough.errors_retried, enough.preemptions) == (3, 2, 0)
    assert too_few.state is RunState.FAILED, run_log("too-few")
    assert (too_few.attempt, too_few.errors_retried, too_few.preemptions) == (2, 1, 0)
    assert "an error in your code" in too_few.detail and "--max-restarts 1" in too_few.detail


@pytest.mark.catalog
@pytest.mark.slow
def test_a_preemption_does_not_spend_the_error_budget(tmp_path: Path) -> None:
    """Preempted once, then one error, then done, under --max-restarts 1: both recovered (the
    old local rule, every relaunch against --max-restarts, failed it at the second)."""
    script, folder = _script(tmp_path), tmp_path / "run"
    # A moment before the relaunch: `chaos preempt` kills the node's processes until none is
    # left, and would take a relaunch in the same instant for a second preemption.
    _launch("flaky", script, folder, 1, True, "--max-restarts", "1", "--recovery-delay", "2s")
    wait_until((folder / "waiting").exists, 120, "the first attempt to wait")
    cli("chaos", "preempt", "flaky", "--node", "0")
    state = wait_final("flaky")
    assert state.state is RunState.SUCCEEDED, run_log("flaky")
    assert (state.attempt, state.preemptions, state.errors_retried) == (3, 1, 1)
    assert state.restarts == 2  # every relaunch, of either kind
    assert "attempt 3: done" in run_log("flaky")


def test_retry_on_error_is_a_deprecated_alias(project: Path) -> None:
    """`--retry-on-error N` is `--max-restarts N`, with a one-line notice; both: refused."""
    script = str(project / "train.py")
    base = ["up", script, "--cloud", "local", "--gpus", "cpu:1", "--name", "al", "--yes"]
    result = runner.invoke(app, [*base, "--dryrun", "--retry-on-error", "2"])
    assert result.exit_code == 0, result.output
    notices = [line for line in result.stderr.splitlines() if line.startswith("notice: ")]
    assert len(notices) == 1 and "--retry-on-error is deprecated" in notices[0]
    result = runner.invoke(app, [*base, "--retry-on-error", "2", "--max-restarts", "5"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --retry-on-error is the old name of --max-restarts")


def test_the_alias_becomes_max_restarts() -> None:
    from mncloud.cli.options import launch_options_from, retry_alias
    from mncloud.spec.launch import LaunchOptions

    values: dict[str, object] = {"retry_on_error": 4, "max_restarts": None}
    assert retry_alias(values) and values["max_restarts"] == 4
    assert launch_options_from(values) == LaunchOptions()  # no longer a launch option
    assert "retry_on_error" not in LaunchOptions.model_fields
    assert retry_alias({"retry_on_error": None, "max_restarts": 2}) is None


def test_the_supervisor_s_events_become_record_events_by_what_came_before(tmp_path: Path) -> None:
    """A relaunch after a preemption is a `recovery` in the run record, after an error a
    `restart`; a node lost or joined is priced at the nodes billed then; the rest map by kind
    or are not recorded (`backends/local/recordwriter.py`)."""
    from mncloud.backends.local.nodes import RunLogs
    from mncloud.backends.local.recordwriter import RecordWriter
    from mncloud.backends.local.state import Event

    writer = RecordWriter("r", 2, RunLogs(tmp_path, 3), price=3.0)
    queued: list[tuple[str, float | None]] = []
    writer.put = lambda kind, _message, _node, _at, price=None: queued.append((kind, price))  # type: ignore[method-assign]
    events: list[Event] = []
    for kind, attempt, billed in [("launch", 1, 3), ("preempted", 1, 3), ("launch", 2, 3),
                                  ("node-lost", 2, 2), ("setup", 2, 2), ("error", 2, 3),
                                  ("launch", 3, 3), ("succeeded", 3, 3)]:  # fmt: skip
        events.append(Event(t=1.0, kind=kind, message=kind, attempt=attempt))
        writer.supervisor_event(kind, kind, None, 1.0, attempt, events, billed, 3)
    writer.flush()
    assert queued == [("launch", None), ("preemption", None), ("recovery", None),
                      ("node-lost", 2.0), ("failure", None), ("restart", None),
                      ("finish", None)]  # fmt: skip


def test_an_attempt_s_exit_codes_say_what_ended_it() -> None:
    """Preempted (a signal, 115, or chaos asked), a storage outage (every failed node exited
    75), or an error (`backends/local/exits.py`); a node still running (None) does not count."""
    from mncloud import constants
    from mncloud.backends.local.exits import ending

    outage, preempted = constants.STORAGE_OUTAGE_EXIT_CODE, constants.PREEMPTED_EXIT_CODE
    assert ending({0: None, 1: outage}, set()).outcome == "outage"
    assert ending({0: outage, 1: outage}, set()).message.startswith("node 0 found its bucket")
    assert ending({0: 1, 1: outage}, set()).outcome == "error"
    assert ending({0: outage, 1: -9}, set()).outcome == "preempted"
    assert ending({0: outage, 1: None}, {1}).outcome == "preempted"
    end = ending({0: preempted, 1: None}, set())
    assert (end.outcome, end.node, end.lost) == ("preempted", 0, {0})


def test_a_storage_outage_is_retried_with_a_backoff_outside_max_restarts() -> None:
    """Outages in a row wait longer each time (never less than --recovery-delay) and spend
    nothing of --max-restarts; errors spend it; a refusal ends the run."""
    from mncloud.backends.local.exits import end_tail, next_launch
    from mncloud.backends.local.state import LocalLaunch, LocalState

    shape = {"name": "r", "token": "t", "task_id": "x", "num_nodes": 2, "procs_per_node": 1,
             "master_port": 1, "ckpt_uri": "file:///tmp/r"}  # fmt: skip
    la = LocalLaunch(**shape, workdir=".", run="true", max_restarts=0, recovery_delay=3.0)
    st = LocalState(**shape)
    waits = [next_launch(st, la, "outage", "node 0 …", n) for n in range(1, 8)]
    delays = [w[0] for w in waits if w is not None]
    assert delays == [3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 120.0]  # 2, 4, … at least the delay
    assert (st.outages, st.restarts, st.errors_retried) == (7, 7, 0)
    assert waits[0] is not None and "not counted against --max-restarts" in waits[0][1]
    assert end_tail(st) == "7 restarts, 0 preemptions, 7 storage outages"
    assert next_launch(st, la, "error", "node 1 exited with code 1", 0) is None
    assert "retried 0 of --max-restarts 0" in st.detail
    assert next_launch(st, la, "refused", "a mismatch", 0) is None and st.refused


def test_a_relaunch_after_a_storage_outage_is_a_restart_in_the_record(tmp_path: Path) -> None:
    from mncloud.backends.local.nodes import RunLogs
    from mncloud.backends.local.recordwriter import RecordWriter
    from mncloud.backends.local.state import Event

    writer = RecordWriter("r", 1, RunLogs(tmp_path, 1))
    queued: list[str] = []
    writer.put = lambda kind, *_args, **_kw: queued.append(kind)  # type: ignore[method-assign]
    events: list[Event] = []
    for kind, attempt in [("launch", 1), ("preempted", 1), ("launch", 2), ("outage", 2),
                          ("launch", 3), ("succeeded", 3)]:  # fmt: skip
        events.append(Event(t=1.0, kind=kind, message=kind, attempt=attempt))
        writer.supervisor_event(kind, kind, None, 1.0, attempt, events, 1, 1)
    writer.flush()
    assert queued == ["launch", "preemption", "recovery", "failure", "restart", "finish"]
