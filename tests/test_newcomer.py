"""A newcomer's first commands (issue #29): local when no cloud is enabled, names that differ.

"No cloud enabled" is what SkyPilot itself reports: its state database holds no enabled cloud
(`sky check` never ran, as on a fresh machine and in this test environment, which has no cloud
credentials). Each test that needs it points `SKY_RUNTIME_DIR` at an empty folder of its own,
so it never depends on the developer's machine or on a test that seeded SkyPilot before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import request
from mncloud.backends.base import RunState
from mncloud.backends.registry import known_runs
from mncloud.catalog import clouds as skycheck
from mncloud.cli import app
from mncloud.options import JobOptions
from tests.test_local import run_log, wait_final

runner = CliRunner()


@pytest.fixture
def no_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SkyPilot's runtime folder, empty: `sky check` never ran, so no cloud is enabled."""
    folder = tmp_path / "sky-runtime"
    folder.mkdir()
    monkeypatch.setenv("SKY_RUNTIME_DIR", str(folder))
    for name in ("SKYPILOT_DB_CONNECTION_URI", "SKYPILOT_API_SERVER_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SKYPILOT_CONFIG", str(tmp_path / "no-sky-config.yaml"))
    return folder


def test_skypilot_itself_reports_no_cloud_in_a_fresh_state(tmp_path: Path) -> None:
    """In a fresh SkyPilot state (its database created by SkyPilot, nothing seeded), SkyPilot
    and `skycheck` agree: no cloud is enabled. A process of its own, so SkyPilot opens that
    database and not this session's."""
    code = (
        "from sky import global_user_state, skypilot_config\n"
        "from sky.clouds import cloud\n"
        "ws = skypilot_config.get_active_workspace()\n"
        "sky = global_user_state.get_cached_enabled_clouds(cloud.CloudCapability.COMPUTE, ws)\n"
        "from mncloud.catalog import clouds as skycheck\n"
        "assert skycheck.state_db().exists()\n"
        "print(repr((list(sky), skycheck.enabled_clouds())))\n"
    )
    env = {**os.environ, "SKY_RUNTIME_DIR": str(tmp_path), "MNCLOUD_HOME": str(tmp_path / "h")}
    env.pop("SKYPILOT_API_SERVER_ENDPOINT", None)
    env.pop("SKYPILOT_DB_CONNECTION_URI", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "([], [])"


def test_no_state_database_means_no_cloud(no_cloud: Path) -> None:
    assert not skycheck.state_db().exists() and skycheck.enabled_clouds() == []
    assert not (no_cloud / ".sky").exists()  # answered without SkyPilot creating its state


def test_a_remote_api_server_is_unknown(no_cloud: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another machine keeps SkyPilot's state: unknown, so nothing changes."""
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "https://sky.example.com")
    assert skycheck.enabled_clouds() is None
    assert request.local_when_no_cloud(JobOptions()) == (JobOptions(), None)
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "http://127.0.0.1:46580")
    assert skycheck.enabled_clouds() == []


def test_with_a_cloud_enabled_nothing_changes(sky_enabled_clouds: list[str], project: Path) -> None:
    assert skycheck.enabled_clouds() == sorted(c.lower() for c in sky_enabled_clouds)
    result = runner.invoke(app, ["up", str(project / "train.py"), "--yes", "--dryrun"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --gpus is required") and "notice" not in result.output


def test_the_fallback_takes_cpu_and_leaves_named_clouds_and_gpus(no_cloud: Path) -> None:
    options, notice = request.local_when_no_cloud(JobOptions())
    assert notice is not None and "sky check" in notice and "\n" not in notice
    assert (options.cloud, options.gpus) == (["local"], f"cpu:{request.LOCAL_CPUS}")
    kept, notice = request.local_when_no_cloud(JobOptions(gpus="cpu:4"))
    assert notice and kept.gpus == "cpu:4"
    for named in (
        JobOptions(cloud=["aws"]),
        JobOptions(gpus="H100:8"),
        JobOptions(cloud="local", gpus="cpu:1"),
    ):
        assert request.local_when_no_cloud(named) == (named, None)


def test_render_and_plan_say_so_in_one_line(no_cloud: Path, project: Path) -> None:
    script = str(project / "train.py")
    result = runner.invoke(app, ["render", script, "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("notice: no cloud")
    config = json.loads(result.stdout)
    assert config["name"] == "train" and "cpus" in config["resources"]
    for args in (["plan"], ["plan", script]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith("notice: no cloud") and result.stderr.count("\n") == 1
        assert result.stdout.startswith("nothing to plan")
    result = runner.invoke(app, ["plan", "--nodes", "0"])
    assert result.exit_code == 2 and result.stderr.startswith("error: --nodes 0")


def test_default_names_are_new_and_explicit_names_keep_the_rule(tmp_path: Path) -> None:
    names = {request.unique_name("train") for _ in range(20)}
    assert len(names) > 1 and all(n.startswith("train-") and len(n) == 10 for n in names)
    long = request.unique_name("x" * 63)
    assert len(long) <= 63
    known = ["train", "other-1a2b", "train-1a2b", "trainer-9f9f", "train-zzzz"]
    assert request.newest_default_run("train", known, "--resume") == "train-1a2b"
    assert request.newest_default_run("train", ["train"], "--resume") == "train"
    with pytest.raises(request.SpecError, match="--resume: no earlier run"):
        request.newest_default_run("train", ["trainer-9f9f", "other"], "--resume")


@pytest.mark.catalog
@pytest.mark.slow
def test_a_first_up_runs_locally_and_a_second_gets_its_own_run(
    no_cloud: Path, project: Path
) -> None:
    """Issue #29: `mncloud up train.py` with no cloud enabled runs on this machine, and the
    same command again is a second run beside the first, not refused."""
    script = str(project / "train.py")
    for _ in range(2):
        result = runner.invoke(app, ["up", script, "--yes", "--detach"])
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith("notice: no cloud is enabled in SkyPilot")
        assert result.stderr.count("\n") == 1
    runs = known_runs()
    assert len(runs) == 2 and all(r.startswith("train-") for r in runs) and runs[0] != runs[1]
    for name in runs:
        state = wait_final(name)
        assert state.state is RunState.SUCCEEDED, run_log(name)
        assert "hi" in run_log(name)
    result = runner.invoke(app, ["up", script, "--yes", "--detach", "--name", runs[0]])
    assert result.exit_code == 2 and "--resume" in result.stderr  # an explicit name: the rule
    result = runner.invoke(app, ["up", script, "--resume", "--yes", "--detach"])
    assert result.exit_code == 0, result.output
    assert f"--resume: {runs[1]}, the newest run" in result.stderr
    assert known_runs() == [runs[0], runs[1]]  # the newest resumed, no third run
    assert wait_final(runs[1]).state is RunState.SUCCEEDED
