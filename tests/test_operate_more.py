"""Operating runs as a newcomer does (issue #29): a broken run folder never hides the others,
`logs --tail/--since`, `status --watch`, and a mncloud.yaml key that does not exist.

Runs are real local runs (`--launcher none`: the script runs on each node without torchrun, so
a run takes about a second); a broken folder is made the way one breaks: a launch that stopped
before its run started, a torn state.json, an unreadable controller state.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import layout
from mncloud.backends.local.state import LOG_MARKS, RUN_LOG, load_state, read_jsonl
from tests.test_local import cli as succeeded

pytestmark = pytest.mark.catalog
runner = CliRunner()


def cli(*args: str) -> Any:
    from mncloud.cli import app

    return runner.invoke(app, list(args))


ok = succeeded  # tests/test_local.py's: `mncloud ARGS`, asserted to exit 0


def one_line_error(result: Any, *needles: str) -> str:
    """The result is one `error: …` line on stderr, exit 2, nothing on stdout."""
    assert result.exit_code == 2, result.output
    assert not result.stdout and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])


def run_local(project: Path, name: str, script: str = "train.py", *flags: str) -> None:
    """A real local run, to its end (`up` without --detach follows it)."""
    ok("up", str(project / script), "--cloud", "local", "--gpus", "cpu:1", "--launcher",
       "none", "--name", name, "--yes", *flags)  # fmt: skip
    assert load_state(layout.run_dir(name)).state.value == "SUCCEEDED"


# --------------------------------------------------------------------------- broken run folders


@pytest.fixture
def broken(project: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Two good runs and three broken ones; the broken ones and why."""
    monkeypatch.delenv("OPERATE_TEST_UNSET_SECRET", raising=False)
    run_local(project, "good-1")
    # A launch that stopped before its run started: backend.json, no state.json.
    secret = "OPERATE_TEST_UNSET_SECRET"
    result = cli("up", str(project / "train.py"), "--cloud", "local", "--gpus", "cpu:1",
                 "--name", "no-start", "--secret", secret, "--yes")  # fmt: skip
    one_line_error(result, secret)
    # A state.json torn in the middle of a write.
    run_local(project, "torn")
    state = layout.run_dir("torn") / "state.json"
    state.write_text(state.read_text()[:40])
    # A deadline run whose controller state cannot be read (and that never launched).
    control = layout.control_state_file("bad-control")
    control.parent.mkdir(parents=True)
    control.write_text('{"name": "bad-control", "config": ')
    run_local(project, "good-2")
    return {"no-start": "state.json is missing", "torn": "state.json: Invalid JSON",
            "bad-control": "control/state.json: Invalid JSON"}  # fmt: skip


def test_status_lists_every_run_and_marks_the_broken_ones(broken: dict[str, str]) -> None:
    rows = json.loads(ok("status", "--json").stdout)
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == {"good-1", "good-2", *broken}
    assert by_name["good-1"]["state"] == by_name["good-2"]["state"] == "SUCCEEDED"
    for name, reason in broken.items():
        assert by_name[name]["state"] == "UNREADABLE", by_name[name]
        assert reason in by_name[name]["detail"], by_name[name]
    table = ok("status").stdout
    assert "good-1" in table and "good-2" in table and "SUCCEEDED" in table
    assert table.count("UNREADABLE") == 3
    for name, reason in broken.items():
        assert f"{name}: {reason}" in " ".join(table.split()), table


def test_status_of_a_broken_run_is_one_line(broken: dict[str, str]) -> None:
    for name, reason in broken.items():
        one_line_error(cli("status", name), f"run {name!r} cannot be read", reason)
        one_line_error(cli("status", name, "--json"), reason)
    assert json.loads(ok("status", "good-2", "--json").stdout)[0]["state"] == "SUCCEEDED"
    one_line_error(cli("status", "never-was"), "no run named 'never-was'")


# --------------------------------------------------------------------------- status --watch


def test_status_watch_refreshes_a_bounded_number_of_times(project: Path) -> None:
    run_local(project, "watched")
    out = ok("status", "--watch", "--every", "0.01s", "--watch-count", "3").stdout
    assert out.count("mncloud runs") == 3 and out.count("watched") >= 3
    lines = ok("status", "-w", "--every", "0.01s", "--watch-count", "2", "--json").stdout
    snapshots = [json.loads(line) for line in lines.splitlines()]
    assert [[s["name"] for s in snap] for snap in snapshots] == [["watched"], ["watched"]]
    one_line_error(cli("status", "--watch", "--every", "0s"), "--every")
    one_line_error(cli("status", "--watch", "--watch-count", "0"), "--watch-count")


def test_status_watch_stops_cleanly_on_ctrl_c(project: Path) -> None:
    """SIGINT (Ctrl-C) after the first refresh: exit 0, no traceback."""
    run_local(project, "watched")
    script = Path(sys.executable).parent / "mncloud"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}
    proc = subprocess.Popen(
        [str(script), "status", "--watch", "--every", "1h", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # Ctrl-C as in a terminal: a suite started in the background (`cmd &`) passes SIGINT on
        # ignored, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the first refresh has been printed
        assert [s["name"] for s in first] == ["watched"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and not out.strip()


# --------------------------------------------------------------------------- logs --tail/--since

SLOW = """import os, time
for i in range(4):
    print("line", i, "node", os.environ["SKYPILOT_NODE_RANK"], flush=True)
    time.sleep(1.1)
"""


def test_logs_tail_and_since(project: Path) -> None:
    (project / "slow.py").write_text(SLOW)
    run_local(project, "talky", "slow.py", "--nodes", "2")
    every = ok("logs", "talky").stdout.splitlines()
    assert len(every) > 8 and "[node 1] line 3 node 1" in every
    assert ok("logs", "talky", "--tail", "3").stdout.splitlines() == every[-3:]
    assert ok("logs", "talky", "-n", "0").stdout == ""
    assert ok("logs", "talky", "--tail", "10000").stdout.splitlines() == every
    node_1 = ok("logs", "talky", "--node", "1", "--tail", "2").stdout.splitlines()
    assert node_1 == ["[node 1] line 2 node 1", "[node 1] line 3 node 1"]
    # --since a time: the lines from the newest mark at that time on (marks: one a second).
    folder = layout.run_dir("talky")
    marks = read_jsonl(folder / LOG_MARKS)
    assert len(marks) >= 3
    mark = marks[len(marks) // 2]
    after = (folder / RUN_LOG).read_bytes()[mark["offset"] :].decode().splitlines()
    since = dt.datetime.fromtimestamp(mark["t"]).isoformat()
    shown = ok("logs", "talky", "--since", since).stdout.splitlines()
    assert shown == after and 0 < len(shown) < len(every)
    on_node_0 = ok("logs", "talky", "--since", since, "--node", "0").stdout.splitlines()
    assert on_node_0 == [line for line in after if line.startswith("[node 0]")] != []
    assert ok("logs", "talky", "--since", since, "--tail", "1").stdout.splitlines() == after[-1:]
    assert ok("logs", "talky", "--since", "1h").stdout.splitlines() == every
    future = (dt.datetime.now() + dt.timedelta(days=1)).isoformat()
    assert ok("logs", "talky", "--since", future).stdout == ""


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tail", "-1"], "--tail"),
        (["--since", "5x"], "--since '5x'"),
        (["--since", "25:00"], "--since '25:00'"),
        (["--since", "-3h"], "--since '-3h'"),
        (["--since", "0s"], "--since '0s'"),
    ],
)
def test_bad_logs_options_are_one_line(project: Path, args: list[str], needle: str) -> None:
    run_local(project, "quiet")
    one_line_error(cli("logs", "quiet", *args), needle)


# --------------------------------------------------------------------------- mncloud.yaml


def test_an_unknown_mncloud_yaml_key_is_one_line(project: Path) -> None:
    (project / "mncloud.yaml").write_text("gpus: cpu:2\nnodez: 2\n")
    line = one_line_error(cli("render", str(project / "train.py")), "mncloud.yaml")
    assert "'nodez' (did you mean 'nodes'?)" in line
    assert "gpus, nodes, min_nodes, spot, cloud" in line and "max_hourly" in line
    (project / "mncloud.yaml").write_text("gpus: cpu:2\nnodes: 2\n")
    assert "num_nodes: 2" in ok("render", str(project / "train.py")).stdout
