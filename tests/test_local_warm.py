"""Warm node hosts of a local `up --cluster` run (`backends/local/warm.py`), end to end: real
supervisor, real torchrun, workers forked from the hosts through PYTHON_EXEC, real SIGKILLs.
Bounded polls on the run's own files and processes, no sleeps standing in for events."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from mncloud import constants
from mncloud.backends.base import RunState
from mncloud.backends.local import warm
from mncloud.backends.local.processes import pid_alive, tagged_pids
from mncloud.backends.local.state import load_state
from mncloud.cli import app
from mncloud.layout import run_dir
from tests.test_local import wait_until

pytestmark = pytest.mark.slow
runner = CliRunner()

_SCRIPT = """\
import json, os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
ckpt = Path(os.environ["MNCLOUD_CKPT_URI"].removeprefix("file://"))
ckpt.mkdir(parents=True, exist_ok=True)
steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
start = steps[-1] if steps else 0
with open(f"workers-{rank}.json", "a") as f:  # in the project folder, the nodes' cwd
    f.write(json.dumps({"rank": rank, "pid": os.getpid(), "start": start,
                        "torch": "torch" in sys.modules, "ppid": os.getppid()}))
    f.write("\\n")
print(f"hello from rank {rank}")
if rank == 0:
    (ckpt / str(start + 3)).mkdir()
if len(sys.argv) > 1 and sys.argv[1] == "--boom":
    raise RuntimeError("a typo on purpose")
if len(sys.argv) > 1 and sys.argv[1] == "--sleep":
    time.sleep(600)
"""


def _cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _records(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(folder.glob("workers-*.json"))
        for line in path.read_text().splitlines()
    ]


def _run_processes(name: str) -> list[int]:
    """Every live process of the run: the launch's, the hosts' and the hosts' workers."""
    folder = run_dir(name)
    pids = tagged_pids(load_state(folder).token)
    record = warm.load_hosts(folder)
    if record is not None:
        pids += tagged_pids(record.token) + warm.workers(record)
    return [p for p in pids if pid_alive(p)]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun is not installed (pip install 'mncloud[train]')")
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "train.py").write_text(_SCRIPT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _up(name: str, idle_s: float, monkeypatch: pytest.MonkeyPatch) -> warm.HostsRecord:
    """`up --cluster` to its end, then wait until every node's host listens."""
    monkeypatch.setenv(constants.LOCAL_HOST_IDLE_ENV, str(idle_s))
    result = _cli("up", "train.py", "--cloud", "local", "--gpus", "cpu:2", "--nodes", "2",
                  "--yes", "--name", name, "--no-preflight", "--cluster", "--recovery", "gang",
                  "--max-restarts", "0")  # fmt: skip
    assert result.exit_code == 0, result.output
    folder = run_dir(name)
    record = warm.live_hosts(folder)
    assert record is not None and len(record.pids) == 2
    wait_until(lambda: all(warm.worker_env(folder, n, record) for n in (0, 1)), 60, "hosts ready")
    return record


def test_exec_on_warm_hosts_trains_fails_and_leaves_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = _up("dev", 300, monkeypatch)
    launch_token = load_state(run_dir("dev")).token
    assert hosts.token != launch_token  # a tag of their own: `down` of a launch spares them
    for path in project.glob("workers-*.json"):  # the first run's workers (cold or warm)
        path.unlink()

    result = _cli("exec", "dev")  # follows the run to its end
    assert result.exit_code == 0, result.output
    workers = _records(project)
    assert sorted(w["rank"] for w in workers) == [0, 1, 2, 3]
    assert [w["start"] for w in workers if w["rank"] == 0] == [3]  # resumed from step 3
    assert all(w["torch"] for w in workers)  # forked with torch already imported
    log = (run_dir("dev") / "run.log").read_text()
    assert "[node 1 rank 3] hello from rank 3" in log and "[node 0 rank 0] hello" in log
    assert warm.live_hosts(run_dir("dev")) is not None  # the hosts stay up

    failed = _cli("exec", "dev", "train.py", "--", "--boom")
    assert failed.exit_code == 1, failed.output
    (shown,) = json.loads(_cli("status", "dev", "--json").output)
    assert shown["state"] == RunState.FAILED.value
    log = (run_dir("dev") / "run.log").read_text()
    assert "Traceback (most recent call last):" in log
    assert "RuntimeError: a typo on purpose" in log and "warmrun.py" not in log

    for path in project.glob("workers-*.json"):
        path.unlink()
    assert _cli("exec", "dev", "train.py", "--detach", "--", "--sleep").exit_code == 0
    pids = wait_until(lambda: len(_records(project)) == 4 and _records(project), 60, "4 workers")
    children = set(warm.workers(hosts))
    assert {w["pid"] for w in pids} <= children  # each a child of its node's host (psutil)
    for w in pids:
        assert psutil.Process(w["pid"]).ppid() in hosts.pids
    listed = wait_until(
        lambda: {p for n in load_state(run_dir("dev")).nodes for p in n.pids} >= children,
        10, "the workers in state.json",
    )  # fmt: skip
    assert listed
    for text in ((run_dir("dev") / f).read_text() for f in ("run.sh", "task.yaml")):
        assert "PYTHON_EXEC" not in text  # the rendered task is untouched: only the env

    # chaos preemption: SIGKILL to node 1's launcher, torchrun and clients; its host kills
    # its workers at once, and the supervisor relaunches the gang.
    assert _cli("chaos", "preempt", "dev", "--node", "1").exit_code == 0
    gone = wait_until(lambda: not any(pid_alive(w["pid"]) for w in pids), 15, "the workers gone")
    assert gone
    wait_until(lambda: len(_records(project)) >= 8, 90, "the relaunch's workers")

    down = _cli("down", "dev", "--now")
    assert down.exit_code == 0, down.output
    assert "warm host process(es) stopped" in down.output
    assert not _run_processes("dev")
    assert not any(pid_alive(p) for p in hosts.pids)
    assert not any(pid_alive(w["pid"]) for w in _records(project))


def test_idle_hosts_end_and_exec_falls_back_to_cold_workers(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = _up("idle", 3, monkeypatch)
    folder = run_dir("idle")
    (shown,) = json.loads(_cli("status", "idle", "--json").output)
    assert "local cluster tears down after 0.05 idle minutes" in shown["detail"]
    wait_until(lambda: not any(pid_alive(p) for p in hosts.pids), 30, "the idle hosts to exit")
    assert not (folder / "nodes" / "node-0" / warm.SOCKET).exists()
    (shown,) = json.loads(_cli("status", "idle", "--json").output)
    assert "warm hosts are gone" in shown["detail"]

    for path in project.glob("workers-*.json"):
        path.unlink()
    result = _cli("exec", "idle")
    assert result.exit_code == 0, result.output
    log = (folder / "run.log").read_text()
    assert log.count("warm hosts are gone") == 1
    assert [w["start"] for w in _records(project) if w["rank"] == 0] == [3]
    # not from the gone hosts: from the exec's own node hosts (vm.py), booted for it
    assert not {w["ppid"] for w in _records(project)} & set(hosts.pids)
    wait_until(lambda: not _run_processes("idle"), 15, "the supervisor to exit")
