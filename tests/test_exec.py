"""Iterate on a live cluster (issue #36): `up --cluster` keeps a plain SkyPilot cluster up with
autodown after `--idle-minutes`; `mncloud exec NAME` runs the recorded task on it again through
`sky.exec` (the fake bound to its real signature); `down` tears it down; locally, `exec` reruns
on the run's own nodes with real torchrun, resuming from the newest checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from typer.testing import CliRunner

from mncloud.backends.base import RunState
from mncloud.cli import app
from mncloud.layout import run_dir

if TYPE_CHECKING:
    from tests.fakesky import FakeSky

runner = CliRunner()
UP = ["up", "train.py", "--gpus", "H100:8", "--nodes", "2", "--cloud", "aws", "--yes"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "eval.py").write_text("print('eval')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _job_done(fake: FakeSky, name: str, job_id: int) -> None:
    from sky.skylet import job_lib

    fake.clusters[name]["jobs"][job_id] = job_lib.JobStatus.FAILED  # a typo, say


@pytest.mark.catalog
def test_up_cluster_then_exec_sends_the_same_task_and_down_tears_it_down(
    project: Path, fake_sky: FakeSky
) -> None:
    result = _cli(*UP, "--cluster", "--idle-minutes", "30", "--name", "dev", "--detach")
    assert result.exit_code == 0, result.output
    ((args, kwargs),) = fake_sky.called("launch")
    assert kwargs == {"cluster_name": "dev", "idle_minutes_to_autostop": 30, "down": True}
    assert not fake_sky.called("jobs.launch")  # a plain cluster, not a managed job
    assert all(not r.use_spot for r in args[0].resources)  # no recovery: on-demand
    meta = json.loads((run_dir("dev") / "skypilot.json").read_text())
    assert (meta["kind"], meta["idle_minutes"], meta["job_id"]) == ("cluster", 30, 1)

    _job_done(fake_sky, "dev", 1)
    status = _cli("status", "dev", "--json")
    (shown,) = json.loads(status.output)
    assert shown["state"] == "FAILED"
    assert "cluster tears down after 30 idle minutes" in shown["detail"]
    assert "mncloud exec dev" in shown["detail"]

    result = _cli("exec", "dev", "--detach", "--json")
    assert result.exit_code == 0, result.output
    ((exec_args, exec_kwargs),) = fake_sky.called("exec")
    assert exec_kwargs == {"cluster_name": "dev"}
    launched, again = fake_sky.cluster_yamls["dev"]
    assert again == launched  # the same rendered task, as the server loaded it
    assert exec_args[0].run == args[0].run and exec_args[0].envs == args[0].envs
    assert json.loads(result.output)["state"] == "PENDING"
    assert json.loads((run_dir("dev") / "skypilot.json").read_text())["job_id"] == 2

    _job_done(fake_sky, "dev", 2)
    result = _cli("exec", "dev", "eval.py", "--detach", "--", "--fast")
    assert result.exit_code == 0, result.output
    *_, sent = yaml.safe_load_all(fake_sky.cluster_yamls["dev"][2])  # the DAG's task document
    assert "eval.py --fast" in sent["run"]  # (the text wraps long double-quoted lines)

    result = _cli("down", "dev", "--now")
    assert result.exit_code == 0, result.output
    assert fake_sky.called("down") and "dev" not in fake_sky.clusters  # nothing left billing


@pytest.mark.catalog
def test_exec_refuses_what_is_not_a_live_cluster(project: Path, fake_sky: FakeSky) -> None:
    """One line, exit 2, saying what the run is and what to do."""
    result = _cli(*UP, "--name", "job", "--detach")
    assert result.exit_code == 0, result.output
    result = _cli("exec", "job")
    assert result.exit_code == 2
    assert "managed job, not a live cluster" in result.output
    assert "--cluster --name job --resume" in result.output

    assert _cli(*UP, "--cluster", "--name", "dev", "--detach").exit_code == 0
    busy = _cli("exec", "dev")  # job 1 still pending on it
    assert busy.exit_code == 2 and "still runs job 1" in busy.output
    busy = _cli("exec", "dev", "--restart")  # refused before anything is set aside
    assert busy.exit_code == 2 and "still PENDING" in busy.output
    fake_sky.clusters.pop("dev")  # autodown after its idle minutes
    gone = _cli("exec", "dev")
    assert gone.exit_code == 2 and "cluster is gone" in gone.output
    assert _cli("down", "dev").exit_code == 0
    downed = _cli("exec", "dev")
    assert downed.exit_code == 2 and "torn down by `mncloud down`" in downed.output
    assert len(fake_sky.called("exec")) == 0

    fake_sky.answers["launch"] = RuntimeError("quota exceeded")  # half-provisioned, say
    assert _cli(*UP, "--cluster", "--name", "bad", "--detach").exit_code == 2
    fake_sky.add_cluster("bad", {"name": "bad", "status": "INIT"}, {})
    assert _cli("down", "bad").exit_code == 0
    assert ("bad",) in [args for args, _kw in fake_sky.called("down")]  # asked all the same

    unknown = _cli("exec", "nobody")
    assert unknown.exit_code == 2 and "no run named 'nobody'" in unknown.output


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--cluster", "--idle-minutes", "-1"], "--idle-minutes -1: it must be greater"),
        (["--idle-minutes", "5"], "add --cluster"),
        (["--cluster", "--deadline", "3h", "--hours", "1"], "drop one of them"),
    ],
)
def test_bad_cluster_flags_are_one_line_and_exit_2(
    project: Path, flags: list[str], said: str
) -> None:
    result = _cli("up", "train.py", "--cloud", "local", "--gpus", "cpu:1", "--yes", *flags)
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


# --------------------------------------------------------------------------- local exec

_SCRIPT = """\
import json, os, sys, time
from pathlib import Path
rank = int(os.environ.get("RANK", "0"))
ckpt = Path(os.environ["MNCLOUD_CKPT_URI"].removeprefix("file://"))
ckpt.mkdir(parents=True, exist_ok=True)
steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
start = steps[-1] if steps else 0
if rank == 0:
    (ckpt / str(start + 3)).mkdir()
    with open("starts.txt", "a") as f:  # in the project folder, the nodes' cwd
        f.write(f"{start} {os.environ.get('MNCLOUD_LOCAL_NODE', '')}\\n")
"""


@pytest.mark.slow
def test_local_exec_reruns_on_the_same_nodes_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun is not installed (pip install 'mncloud[train]')")
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "train.py").write_text(_SCRIPT)
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "setup-runs.txt"
    up = ["up", "train.py", "--cloud", "local", "--gpus", "cpu:1", "--nodes", "2", "--yes"]
    result = _cli(*up, "--name", "loc", "--no-preflight", "--setup", f"echo x >> {marker}")
    assert result.exit_code == 0, result.output
    assert marker.read_text().count("x") == 2  # setup once per node

    result = _cli("exec", "loc")  # follows the run to its end, as `up` does
    assert result.exit_code == 0, result.output
    (shown,) = json.loads(_cli("status", "loc", "--json").output)
    assert shown["state"] == RunState.SUCCEEDED.value
    assert marker.read_text().count("x") == 2  # no setup: the nodes are up already
    starts = (tmp_path / "starts.txt").read_text().split("\n")
    assert [s.split()[0] for s in starts if s] == ["0", "3"]  # resumed from step 3
    assert (run_dir("loc") / "nodes" / "node-1").is_dir()
    log = (run_dir("loc") / "run.log").read_text()
    assert log.count("attempt 1: 2 node(s)") == 2  # both runs' lines, appended
    assert log.count("setup on node") == 2  # the first run's only

    result = _cli("exec", "loc", "--restart")
    assert result.exit_code == 0, result.output
    starts = (tmp_path / "starts.txt").read_text().split("\n")
    assert [s.split()[0] for s in starts if s] == ["0", "3", "0"]  # from step 0 again
    aside = [p.name for p in run_dir("loc").iterdir() if p.name.startswith("checkpoints.")]
    assert len(aside) == 1  # the old checkpoints set aside, never deleted


@pytest.mark.catalog
def test_a_cluster_bills_in_its_record_until_down_and_a_relaunch_takes_over(
    project: Path, fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's billed time: from the cluster's own launch time (`up` sent at t, the
    cluster UP at t+30: the wait is not billed); a job that ended on a cluster still up ends
    nothing (it bills on, idle); `up --resume` onto the same cluster reuses it (nothing torn
    down), closes the first record and opens its own; `down` closes that one."""
    from mncloud.records.ledger import cost_segments
    from mncloud.records.store import list_records
    from tests.test_ledger_times import Clock

    clock = Clock(monkeypatch)
    clock.now = float(int(clock.now)) + 0.5
    fake_sky.clock = lambda: clock.now + 30  # provisioning: UP (`launched_at`) 30 s later

    def billed_s(record: Any) -> float:
        return sum(s.end - s.start for s in cost_segments(record, clock.now))

    sent = clock.now
    assert _cli(*UP, "--cluster", "--name", "dev", "--detach").exit_code == 0
    clock.now += 600
    _job_done(fake_sky, "dev", 1)
    assert _cli("status", "dev", "--json").exit_code == 0
    (first,) = list_records("dev")
    assert [e.kind for e in first.events] == ["launch", "waiting", "running"]
    assert first.events[0].hourly_price and first.events[0].cloud == "aws"
    assert first.events[-1].time == int(sent + 30)  # the cluster is up: billing on from there
    assert billed_s(first) == pytest.approx(600 - 29.5)

    again = _cli(*UP, "--cluster", "--name", "dev", "--detach", "--resume")
    assert again.exit_code == 0, again.output
    assert not fake_sky.called("down")  # the relaunch reuses the cluster
    assert len(fake_sky.called("launch")) == 2
    clock.now += 600
    assert _cli("status", "dev", "--json").exit_code == 0
    first, second = list_records("dev")
    assert [e.kind for e in first.events] == ["launch", "waiting", "running", "finish"]
    assert [e.kind for e in second.events] == ["launch", "waiting", "running"]
    assert billed_s(first) == pytest.approx(600 - 29.5)  # closed at the takeover
    assert billed_s(second) == pytest.approx(600 - 29.5)
    assert _cli("down", "dev").exit_code == 0
    first, second = list_records("dev")
    assert [e.kind for e in second.events] == ["launch", "waiting", "running", "finish"]
    assert len(first.events) == 4
    assert billed_s(second) == pytest.approx(600 - 29.5)
