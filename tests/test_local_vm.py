"""Each local node's warm host, its "VM" (`backends/local/vm.py`): torch imported once per node
boot, and the preflight's bandwidth figure reused only on nodes that all predate it.

The fast tests hold the reuse rule against a real published figure (a file:// bucket) and the
doctor's reuse path; the slow one is one real run (2 nodes, real torchrun, real SIGKILL) whose
torch imports are counted by the interpreters themselves (`PYTHONPROFILEIMPORTTIME`: every
fresh Python prints one line per module it imports; a forked worker imports nothing anew)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import constants
from mncloud.backends.base import RunState
from mncloud.backends.local import vm
from mncloud.backends.local.chaos import preempt_node
from mncloud.backends.local.processes import pid_alive, tagged_pids
from mncloud.backends.local.state import LocalLaunch, load_state
from mncloud.cli import app
from mncloud.doctor import bandwidth
from mncloud.doctor.node import bandwidth_test
from mncloud.layout import run_dir
from tests.test_local import wait_until


def _launch(tmp_path: Path, **update: Any) -> LocalLaunch:
    return LocalLaunch(name="vm", token="t0k3n", task_id="sky-1_vm_1", num_nodes=2,
                       procs_per_node=1, master_port=1, ckpt_uri=f"file://{tmp_path}/ckpt",
                       workdir=str(tmp_path), run="true", run_id="run-1", **update)  # fmt: skip


def _publish(launch: LocalLaunch, at: float, nodes: int = 2) -> None:
    figure = bandwidth.Bandwidth(nodes, "gloo", 1.5, {1 << 20: 1.5}, run_id=launch.run_id, at=at)
    bandwidth.publish(figure, launch.ckpt_uri)


def test_a_relaunch_reuses_the_figure_only_on_nodes_that_all_predate_it(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    hosts = vm.NodeHosts(tmp_path, launch)
    hosts.booted = {0: 100.0, 1: 100.0}
    assert hosts.bandwidth_env(always=False) == {}  # none published yet: measure
    _publish(launch, at=110.0)
    reused = hosts.bandwidth_env(always=False)  # the same two nodes: reused
    figure = json.loads(reused[constants.BANDWIDTH_KNOWN_ENV])
    assert (figure["busbw_gbs"], figure["at"], figure["nodes"]) == (1.5, 110.0, 2)
    assert hosts.bandwidth_env(always=True) == {}  # --preflight-always: measure
    hosts.booted[1] = 120.0  # node 1 replaced after the figure: measure again
    assert hosts.bandwidth_env(always=False) == {}
    hosts.booted[1] = 110.0  # booted the moment it was measured: not older, measure
    assert hosts.bandwidth_env(always=False) == {}
    _publish(launch, at=130.0, nodes=3)  # a figure of another shape is never reused
    assert hosts.bandwidth_env(always=False) == {}
    hosts.booted = {0: 100.0}  # a node without a host yet: measure
    _publish(launch, at=130.0)
    assert hosts.bandwidth_env(always=False) == {}


def _args(**kw: Any) -> argparse.Namespace:
    base = {"timeout": 5.0, "expect_busbw": 2.0, "fabric": "loopback", "min_bandwidth": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_preflight_judges_a_reused_figure_without_measuring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    figure = {"nodes": 2, "backend": "gloo", "busbw_gbs": 1.5, "sizes": {"1048576": 1.5},
              "at": time.time() - 30, "run_id": "run-1"}  # fmt: skip
    monkeypatch.setenv(constants.BANDWIDTH_KNOWN_ENV, json.dumps(figure))
    # port 1 on an address nothing listens on: a measurement would fail, a reuse cannot
    assert bandwidth_test(_args(), 0, 2, "127.0.0.1", 1) == []
    err = capsys.readouterr().err
    assert "all-reduce bus bandwidth 1.50 GB/s between 2 nodes" in err
    assert "s ago on these nodes, reused" in err
    problems = bandwidth_test(_args(min_bandwidth=5.0), 0, 2, "127.0.0.1", 1)
    assert len(problems) == 1 and "below --min-bandwidth 5 GB/s" in problems[0]
    assert bandwidth.known_figure(json.dumps(figure), 3) is None  # other nodes: measure
    assert bandwidth.known_figure("not json", 2) is None


# ---------------------------------------------------------------- one real run, read by one test

_SCRIPT = """\
import os, sys, time
from pathlib import Path
rank, here = os.environ["RANK"], Path(sys.argv[1])
for attempt in ("first", "second"):
    marker = here / f"{attempt}-{rank}"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        if attempt == "first":
            sys.exit(3)  # an error in attempt 1: relaunched on the same nodes
        time.sleep(600)  # attempt 2: the test preempts node 1
print(f"done {rank}", flush=True)
"""
_TORCH_IMPORT = re.compile(r"import time:.*\|\s+torch\._C$", re.MULTILINE)
"""torch's compiled core: one line for each interpreter that imports torch afresh."""


@pytest.fixture(scope="module")
def vm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """2 nodes × 1 process: an error, then a preemption of node 1, then success."""
    if not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun is not installed (pip install 'mncloud[train]')")
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("vm")
    try:
        mp.setenv("MNCLOUD_HOME", str(root / "home"))
        mp.setenv("PYTHONPROFILEIMPORTTIME", "1")  # every fresh interpreter lists its imports
        (root / "pyproject.toml").write_text("[project]\nname='p'\n")
        (root / "train.py").write_text(_SCRIPT)
        mp.chdir(root)
        result = CliRunner().invoke(app, [
            "up", "train.py", "--cloud", "local", "--gpus", "cpu:1", "--nodes", "2", "--yes",
            "--name", "vm", "--recovery", "gang", "--max-restarts", "1", "--recovery-delay",
            "0s", "--detach", "--", str(root),
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        folder = run_dir("vm")
        wait_until(lambda: all((root / f"second-{r}").exists() for r in "01"), 240, "attempt 2")
        preempt_node(folder, 1, by="test")
        state = wait_until(lambda: (s := load_state(folder)).state.is_final and s, 240, "the end")
        leftover = wait_until(lambda: not tagged_pids(state.token) and [1], 15, "no process")
        return {"folder": folder, "state": state, "leftover": leftover}
    finally:
        mp.undo()


@pytest.mark.slow
def test_torch_once_per_node_boot_and_the_figure_reused_on_the_same_nodes(
    vm_run: dict[str, Any],
) -> None:
    folder, state = vm_run["folder"], vm_run["state"]
    assert state.state is RunState.SUCCEEDED, state.detail
    assert (state.attempt, state.errors_retried, state.preemptions) == (3, 1, 1)
    # torch imported by the hosts alone: 2 at attempt 1, none at the error's relaunch on the
    # same nodes, 1 (node 1's new VM) after the preemption. No preflight, torchrun agent or
    # worker imported it (their output is in run.log): 3, not 2 × 3 per attempt.
    assert len(_TORCH_IMPORT.findall((folder / "supervisor.log").read_text())) == 3
    log = (folder / "run.log").read_text()
    assert "import time:" in log and not _TORCH_IMPORT.findall(log)
    parts = re.split(r"\] attempt \d: ", log)[1:]
    assert len(parts) == 3
    measured = [
        [line for line in part.splitlines() if "all-reduce bus bandwidth" in line] for part in parts
    ]
    assert all(len(lines) == 2 for lines in measured), measured  # one line per node
    assert not any("reused" in line for line in measured[0])  # measured at the start
    assert all("on these nodes, reused" in line for line in measured[1])  # same nodes
    assert not any("reused" in line for line in measured[2])  # node 1 is new: measured
    assert vm_run["leftover"]  # no host (nor anything of the run) outlives it
    assert not any(pid_alive(p) for n in state.nodes for p in n.pids)


def test_preflight_always_with_no_preflight_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = CliRunner().invoke(app, ["up", str(script), "--cloud", "local", "--gpus", "cpu:1",
                                      "--preflight-always", "--no-preflight"])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--preflight-always" in lines[0] and "--no-preflight" in lines[0]
    assert not run_dir("train").exists()  # nothing launched
