"""`--recovery node` on clouds: the run as a SkyPilot job group, offline.

- Rendering: header, an on-demand CPU lighthouse task, one single-node task per node with its
  replica number and the lighthouse's address; checked by SkyPilot's schema per task and by
  SkyPilot's own job-group loader as a whole.
- Launch, status, logs and down go through the backend with only the SDK calls that talk to
  SkyPilot's API server replaced (`tests/fakesky.py`); the dry run is
  SkyPilot's own, in-process, over the catalog snapshot.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from mncloud import constants
from mncloud.backends.base import LaunchRequest, RunState
from mncloud.backends.registry import record_backend
from mncloud.backends.skypilot import META_FILE, SkyPilotBackend
from mncloud.backends.skypilot.group import group_state
from mncloud.errors import BackendError, MncloudError, RenderError
from mncloud.layout import run_dir
from mncloud.render import jobgroup, render
from mncloud.request import build_spec
from mncloud.spec import min_replicas
from tests.fakesky import FakeSky
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog

REPO = Path(__file__).resolve().parents[1]
SECRET_VALUE = "hf_s3cr3t_value_never_in_files"
BUCKET = "s3://team-ckpt"
ODD_ARG = "--note=it's; $(rm -rf /)"


@pytest.fixture
def script(project: Path) -> Path:
    path = project / "train.py"
    path.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    return path


def _spec(script: Path, **flags: Any) -> Any:
    flags = {"gpus": "H100:8", "nodes": 3, "spot": True, "name": "llm", "bucket": BUCKET, **flags}
    return build_spec(script, recovery="node", **flags)


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


# ------------------------------------------------------------------------------- render


def test_three_node_spot_run_renders_as_a_job_group(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    spec = _spec(script, secret=["HF_TOKEN"], env=["NOTE=a b;$x"], script_args=[ODD_ARG])
    task = render(spec, run_id="r-1")

    header, lighthouse, *nodes = _docs(task.yaml_text)
    assert task.documents == (header, lighthouse, *nodes) and task.config == nodes[0]
    assert task.spot is True
    names = ["llm-node-0", "llm-node-1", "llm-node-2"]
    assert header == {
        "name": "llm",
        "execution": "parallel",
        "primary_tasks": names,
        "inter_connection": False,  # the nodes find the lighthouse through the bucket
    }
    # The lighthouse: a small on-demand CPU task that a spot preemption never takes.
    assert lighthouse["name"] == "llm-lighthouse"
    assert lighthouse["resources"]["cpus"] == "2+"
    assert lighthouse["resources"]["use_spot"] is False
    assert "accelerators" not in lighthouse["resources"] and "num_nodes" not in lighthouse
    assert f"torchft=={jobgroup.TORCHFT_VERSION}" in lighthouse["setup"]
    assert "pip install --quiet ." in lighthouse["setup"]  # this checkout, as its workdir
    assert lighthouse["workdir"] == str(REPO)
    run = lighthouse["run"]
    assert "python -m mncloud.train.lighthouse serve" in run
    assert f"--min-replicas {min_replicas(3)}" in run and "--port 29510" in run
    assert "--heartbeat-timeout-ms" in run and "--join-timeout-ms" in run
    # It publishes its address beside this launch's checkpoints, with the bucket's secrets.
    assert lighthouse["envs"][constants.CKPT_URI_ENV] == f"{BUCKET}/llm"
    assert lighthouse["envs"][constants.RUN_ID_ENV] == "r-1"
    assert lighthouse["secrets"] == {"HF_TOKEN": None}
    # One single-node spot task per node: the single task's resources and run, own envs.
    assert [n["name"] for n in nodes] == names
    for k, node in enumerate(nodes):
        assert node["num_nodes"] == 1
        assert node["resources"]["accelerators"] == "H100:8"
        assert node["resources"]["use_spot"] is True
        assert node["resources"]["job_recovery"]["recover_on_exit_codes"] == [115, 75]
        envs = node["envs"]
        assert envs[constants.REPLICA_ID_ENV] == str(k)
        assert constants.LIGHTHOUSE_ENV not in envs  # read from the bucket at the start
        assert envs[constants.CKPT_URI_ENV] == f"{BUCKET}/llm"
        assert "python -m mncloud.train.lighthouse find" in node["run"]
        assert envs[constants.RECOVERY_ENV] == "node"
        assert envs[constants.NUM_REPLICAS_ENV] == "3"
        assert envs[constants.RUN_NAME_ENV] == "llm" and envs[constants.RUN_ID_ENV] == "r-1"
        assert envs["NOTE"] == "a b;$x"
        assert node["secrets"] == {"HF_TOKEN": None}
        assert "--standalone" in node["run"] and "--nnodes=1" in node["run"]
        assert "-- train.py '--note=it'\"'\"'s; $(rm -rf /)' &" in node["run"]
    assert SECRET_VALUE not in task.yaml_text
    assert json.loads(task.to_json()) == [header, lighthouse, *nodes]


def test_lighthouse_torchft_is_the_locked_version() -> None:
    lock = (REPO / "requirements" / "lock.txt").read_text()
    assert re.search(rf"^torchft=={re.escape(jobgroup.TORCHFT_VERSION)}$", lock, re.M)


def test_skypilots_job_group_loader_accepts_it(script: Path) -> None:
    from sky import dag as dag_lib

    dag = jobgroup.load_dag(render(_spec(script)).yaml_text)

    assert dag.name == "llm" and dag.execution == dag_lib.DagExecution.PARALLEL
    assert len(dag.tasks) == 4 and all(t.num_nodes == 1 for t in dag.tasks)
    assert dag.primary_tasks == ["llm-node-0", "llm-node-1", "llm-node-2"]
    assert dag.inter_connection is False
    lighthouse, *nodes = dag.tasks
    assert all(not r.use_spot for r in lighthouse.resources)
    assert all(r.use_spot for node in nodes for r in node.resources)
    assert [n.envs[constants.REPLICA_ID_ENV] for n in nodes] == ["0", "1", "2"]
    # Issue #43 point 10: no task of the group (the lighthouse included) gets an API token.
    assert not any(t.api_server_access for t in dag.tasks)


def test_planned_job_group_keeps_the_ordered_fallbacks(script: Path) -> None:
    from mncloud.plan import PlanRequest, make_plan

    spec = _spec(script, spot=None)
    plan = make_plan(PlanRequest.from_spec(spec))
    task = render(spec, plan=plan)
    _header, lighthouse, *nodes = task.documents
    assert task.spot is bool(plan.choice.spot)
    assert lighthouse["resources"]["use_spot"] is False
    for node in nodes:
        ordered = node["resources"]["ordered"]
        assert ordered[0]["instance_type"] == plan.choice.instance_type
    assert len(jobgroup.load_dag(task.yaml_text).tasks) == 4


def test_gang_recovery_and_local_runs_stay_a_single_task(script: Path) -> None:
    gang = build_spec(script, gpus="H100:8", nodes=3, spot=True, name="llm", recovery="gang")
    assert render(gang).documents == ()
    local = build_spec(script, gpus="cpu:1", nodes=2, name="llm", recovery="node", cloud=["local"])
    assert render(local).documents == ()


def test_cli_render_prints_the_job_group(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mncloud.cli import app

    monkeypatch.chdir(script.parent)
    args = ["render", "train.py", "--gpus", "H100:8", "--nodes", "3", "--spot", "--bucket", BUCKET]
    result = CliRunner().invoke(app, [*args, "--recovery", "node", "--name", "llm"])
    assert result.exit_code == 0, result.output
    docs = _docs(result.stdout)
    assert [d["name"] for d in docs] == ["llm", "llm-lighthouse", *jobgroup.node_tasks("llm", 3)]
    as_json = CliRunner().invoke(app, [*args, "--recovery", "node", "--name", "llm", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert len(json.loads(as_json.stdout)) == 5


@pytest.mark.slow
def test_render_does_not_import_skypilot_or_torch(script: Path) -> None:
    """Once SkyPilot's schema is cached (the first render), rendering a job group imports
    neither SkyPilot nor torch."""
    import subprocess
    import sys

    render(_spec(script))  # fills the cache in this test's MNCLOUD_HOME
    code = (
        "import sys\n"
        "from mncloud.request import build_spec\n"
        "from mncloud.render import render\n"
        f"spec = build_spec({str(script)!r}, gpus='H100:8', nodes=3, spot=True, name='llm',"
        f" recovery='node', bucket={BUCKET!r})\n"
        "assert len(render(spec).documents) == 5\n"
        "print(sorted(m for m in ('sky', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------------------- bad input


def test_a_template_that_breaks_the_group_is_one_line(script: Path, tmp_path: Path) -> None:
    bad = tmp_path / "mine.yaml.j2"
    bad.write_text("name: {{ name | yaml }}\nnum_nodes: 2\nrun: echo hi\n")
    with pytest.raises(RenderError) as caught:
        render(_spec(script), template=bad)
    assert "\n" not in str(caught.value) and "single-node task" in str(caught.value)


def test_a_user_template_is_each_node_task(script: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml.j2"
    original = (REPO / "mncloud" / "templates" / "task.yaml.j2").read_text()
    mine.write_text(original.replace("envs:\n", "envs:\n  MINE: '1'\n", 1))
    task = render(_spec(script), template=mine)
    assert all(node["envs"]["MINE"] == "1" for node in task.documents[2:])


@pytest.mark.parametrize(
    ("documents", "expected"),
    [
        ("name: g\nexecution: parallel\n---\nname: a.b\nrun: echo\n", "Invalid job name"),
        ("name: g\nexecution: parallel\nprimary_tasks: [x]\n---\nname: a\n", "unknown job"),
        ("name: g\nexecution: parallel\n", "at least 2 documents"),
    ],
)
def test_skypilot_refusals_are_one_line(documents: str, expected: str) -> None:
    with pytest.raises(RenderError) as caught:
        jobgroup.load_dag(documents)
    assert "\n" not in str(caught.value) and expected in str(caught.value)


def test_a_bad_spec_stops_before_render(script: Path) -> None:
    with pytest.raises(MncloudError) as caught:
        _spec(script, name="Bad_Name")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("bucket", [None, "file:///tmp/ckpt"])
def test_node_recovery_on_a_cloud_needs_a_bucket_its_vms_reach(
    script: Path, bucket: str | None
) -> None:
    """The nodes find the lighthouse in the bucket: without one (or with a folder of this
    machine) rendering `--recovery node` is one line (`plan` still prices it); without
    --recovery the run is a gang."""
    with pytest.raises(MncloudError) as caught:
        render(_spec(script, bucket=bucket))
    assert "\n" not in str(caught.value) and "needs --bucket s3://" in str(caught.value)
    flags = {"gpus": "H100:8", "nodes": 3, "spot": True, "name": "llm", "bucket": bucket}
    assert build_spec(script, **flags).recovery.value == "gang"
    assert build_spec(script, **{**flags, "bucket": BUCKET}).recovery.value == "node"


def test_min_bandwidth_is_checked_by_the_nodes_meeting_in_the_bucket(script: Path) -> None:
    """Each node task is a cluster of its own: its preflight meets the others through the
    bucket (`--meet-nodes`), measures and holds `--min-bandwidth` (run for real on 2 local
    processes in test_bandwidth); with --no-preflight the floor is one line, not ignored."""
    _, _, *nodes = _docs(render(_spec(script, min_bandwidth=50), run_id="r-1").yaml_text)
    for node in nodes:
        preflight = next(x for x in node["run"].splitlines() if "mncloud.doctor node" in x)
        assert "--meet-nodes 3 --bandwidth" in preflight and "--min-bandwidth 50" in preflight
        assert '--bucket "$MNCLOUD_CKPT_URI"' in preflight
    with pytest.raises(MncloudError) as caught:
        render(_spec(script, min_bandwidth=50, preflight=False))
    assert "\n" not in str(caught.value) and "drop --no-preflight" in str(caught.value)
    flags = {"gpus": "H100:8", "nodes": 3, "name": "llm", "bucket": BUCKET, "min_bandwidth": 50}
    gang = render(build_spec(script, recovery="gang", **flags)).yaml_text
    assert "--bandwidth" in gang and "--min-bandwidth 50" in gang and "--meet-nodes 3" not in gang


def test_group_state_follows_the_node_tasks() -> None:
    s = RunState
    assert group_state([s.SUCCEEDED, s.SUCCEEDED]) is s.SUCCEEDED
    assert group_state([s.RUNNING, s.RECOVERING, s.RUNNING]) is s.RECOVERING
    assert group_state([s.RUNNING, s.FAILED]) is s.FAILED
    assert group_state([s.STARTING, s.PENDING]) is s.STARTING
    assert group_state([]) is s.PENDING


# ------------------------------------------------------------------------ launch, operate


def _request(script: Path, dryrun: bool = False, **flags: Any) -> LaunchRequest:
    spec = _spec(script, **flags)
    return LaunchRequest(spec=spec, task=render(spec), plan=None, dryrun=dryrun)


def test_launch_hands_skypilot_the_job_group_dag(
    script: Path,
    fake_sky: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sky import dag as dag_lib

    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    fake_sky.next_job_id = 9
    record_backend("llm", "skypilot")

    status = SkyPilotBackend().launch(_request(script, secret=["HF_TOKEN"]))

    ((args, kwargs),) = fake_sky.called("jobs.launch")
    assert kwargs == {"name": "llm"} and not fake_sky.called("launch")
    dag = args[0]
    assert dag.execution == dag_lib.DagExecution.PARALLEL and len(dag.tasks) == 4
    assert all(t.secrets["HF_TOKEN"].get_secret_value() == SECRET_VALUE for t in dag.tasks)
    assert all("HF_TOKEN" not in t.envs for t in dag.tasks)
    assert status.state is RunState.PENDING and "job group 9" in status.detail
    meta = json.loads((run_dir("llm") / META_FILE).read_text())
    assert meta["kind"] == "job-group" and meta["job_id"] == 9
    assert meta["tasks"] == ["llm-lighthouse", *jobgroup.node_tasks("llm", 3)]
    assert SECRET_VALUE not in "".join(p.read_text() for p in run_dir("llm").iterdir())


def _queue(states: dict[str, tuple[str, int]]) -> Any:
    from sky.schemas.api import responses

    records = [
        responses.ManagedJobRecord.model_validate(
            {
                "job_id": 9,
                "task_id": i,
                "job_name": "llm",
                "task_name": name,
                "status": state,
                "recovery_count": count,
                "cloud": "AWS",
                "region": "us-east-1",
                "submitted_at": 1763700000.0,
                "start_at": 1763700420.5 + i,
                "is_primary_in_job_group": name != "llm-lighthouse",
            }
        )
        for i, (name, (state, count)) in enumerate(states.items())
    ]
    return (records, len(records), {}, len(records))


def _launched(script: Path, fake: FakeSky) -> SkyPilotBackend:
    fake.next_job_id = 9
    record_backend("llm", "skypilot")
    backend = SkyPilotBackend()
    backend.launch(_request(script))
    return backend


def test_status_covers_every_task(
    script: Path,
    fake_sky: FakeSky,
) -> None:
    backend = _launched(script, fake_sky)
    fake_sky.answers["jobs.queue_v2"] = _queue(
        {
            "llm-lighthouse": ("RUNNING", 0),
            "llm-node-0": ("RUNNING", 0),
            "llm-node-1": ("RECOVERING", 2),
            "llm-node-2": ("RUNNING", 1),
        }
    )
    status = backend.status("llm")
    ((_args, kwargs),) = fake_sky.called("jobs.queue_v2")
    assert kwargs["job_ids"] == [9] and "task_name" in kwargs["fields"]
    assert status.state is RunState.RECOVERING and status.restarts == 3
    assert (status.cloud, status.region) == ("AWS", "us-east-1")
    assert "lighthouse RUNNING" in status.detail and "node 1 RECOVERING (2 recoveries)" in (
        status.detail
    )
    assert status.started_at == pytest.approx(1763700421.5)


def test_logs_cover_every_task_and_one_node(script: Path, fake_sky: FakeSky) -> None:
    backend = _launched(script, fake_sky)
    tasks = ["llm-lighthouse", *jobgroup.node_tasks("llm", 3)]
    for task in tasks:
        fake_sky.logs[9, task] = f"({task}, pid=3) hello from {task}\n✓ done\n"
    lines = list(backend.logs("llm"))
    seen = [kw for _args, kw in fake_sky.called("jobs.tail_logs")]
    assert {kw["task"] for kw in seen} == set(tasks)
    assert all(kw["job_id"] == 9 and kw["preload_content"] is False for kw in seen)
    assert "[lighthouse] hello from llm-lighthouse" in lines
    assert "[node 2] hello from llm-node-2" in lines and "[sky] ✓ done" in lines
    fake_sky.calls.clear()
    assert list(backend.logs("llm", node=1)) == ["[node 1] hello from llm-node-1", "[sky] ✓ done"]
    assert [kw["task"] for _args, kw in fake_sky.called("jobs.tail_logs")] == ["llm-node-1"]
    with pytest.raises(BackendError, match="no node 5"):
        list(backend.logs("llm", node=5))


def test_down_cancels_the_whole_group(script: Path, fake_sky: FakeSky) -> None:
    from sky.jobs import ManagedJobStatus as S

    backend = _launched(script, fake_sky)
    fake_sky.set_status(9, S.RUNNING)
    status = backend.down("llm")
    assert fake_sky.called("jobs.cancel") == [((), {"job_ids": [9]})]
    assert status.state is RunState.CANCELLED and "cancelled managed job 9" in status.detail
    assert {t.status for t in fake_sky.job(9).tasks} == {S.CANCELLED}


@pytest.mark.slow
def test_resume_after_a_failed_node_cancels_the_nodes_still_training(
    script: Path, fake_sky: FakeSky
) -> None:
    """Issue #43 point 4: node 1 FAILED past its restarts, nodes 0 and 2 (and the lighthouse)
    train and bill on; `up --resume` takes them down before its launch: one gang per
    checkpoint prefix, never two."""
    from sky.jobs import ManagedJobStatus as S

    from mncloud.launch import Existing, settle_existing

    backend = _launched(script, fake_sky)
    fake_sky.set_status(9, S.RUNNING)
    fake_sky.set_status(9, S.FAILED, task="llm-node-1")
    assert backend.status("llm").state is RunState.FAILED and fake_sky.live_jobs() == [9]
    settle_existing(_spec(script), Existing.RESUME)
    assert fake_sky.live_jobs() == [] and fake_sky.called("jobs.cancel") == [((), {"job_ids": [9]})]
    backend.launch(_request(script))
    assert len(fake_sky.live_jobs()) == 1


@pytest.mark.parametrize(
    ("failed", "state", "said"),
    [
        ("llm-node-1", RunState.FAILED, "node 1 FAILED"),
        ("llm-lighthouse", RunState.RUNNING, "lighthouse FAILED: a lost node can no longer"),
        (None, RunState.SUCCEEDED, "node 2 SUCCEEDED"),
    ],
)
def test_a_failed_node_fails_the_group_a_failed_lighthouse_warns_all_done_is_done(
    script: Path, fake_sky: FakeSky, failed: str | None, state: RunState, said: str
) -> None:
    """The job group as SkyPilot's server loaded it from the YAML round trip: a node task
    that fails past its restarts fails the run; the lighthouse (auxiliary: SkyPilot leaves
    the nodes running) does not; every node done is done."""
    from sky.jobs import ManagedJobStatus as S

    from tests.fakesky import ERROR

    backend = _launched(script, fake_sky)
    assert [t.primary for t in fake_sky.job(9).tasks] == [False, True, True, True]
    fake_sky.set_status(9, S.RUNNING)
    if failed is None:
        fake_sky.set_status(9, S.SUCCEEDED)
    else:
        limit = fake_sky.job(9).tasks[0 if failed == "llm-lighthouse" else 2].max_restarts
        fake_sky.script(9, [ERROR, S.RUNNING] * limit + [ERROR], task=failed)
    for _ in range(2 * limit + 1 if failed else 1):
        status = backend.status("llm")
    assert status.state is state and said in status.detail, status.detail
    if failed:
        assert "user program failure" in status.detail


# ------------------------------------------------------------------------------ dry run


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
def test_dryrun_of_a_node_task_runs_skypilot_for_real(
    script: Path,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
) -> None:
    """A node task of the group, as SkyPilot's jobs controller would launch it: one node."""
    import sky
    from sky import execution, sky_logging

    task = render(_spec(script))
    node = sky.Task.from_yaml_config(dict(task.documents[3]))
    with sky_logging.silent():
        execution.launch(node, cluster_name="llm-node-1", dryrun=True, stream_logs=False)
    from mncloud.backends.skypilot.dryrun import dryrun_choice

    chosen = dryrun_choice("llm-node-1")
    assert chosen.get("cloud") in {c.lower() for c in sky_enabled_clouds}
    assert chosen.get("instance_type")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
def test_dryrun_places_the_group_with_skypilot(
    script: Path,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each distinct task passes SkyPilot's dry run, and SkyPilot's own job-group optimizer
    places the whole group on a VM cloud of the seeded ones, every task in one cloud and
    region (where its VMs reach each other's private addresses; the nodes find the
    lighthouse through the bucket, not by hostname). Nothing is provisioned."""
    import sky
    import sky.jobs

    from mncloud.backends.skypilot.dryrun import dryrun_group

    def forbidden(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a dry run must not provision")

    monkeypatch.setattr(sky, "launch", forbidden)
    monkeypatch.setattr(sky.jobs, "launch", forbidden)
    status = SkyPilotBackend().launch(_request(script, dryrun=True))
    assert "dry run passed" in status.detail and "job group of 3" in status.detail
    assert status.cloud in {c.lower() for c in sky_enabled_clouds} - {"kubernetes"}
    assert not (run_dir("llm") / META_FILE).exists()

    dag = jobgroup.load_dag(render(_spec(script)).yaml_text)
    dryrun_group(dag, "llm", 3, spot=True)
    placed = {(str(t.best_resources.cloud).lower(), t.best_resources.region) for t in dag.tasks}
    assert len(placed) == 1, placed  # the lighthouse and every node: one cloud, one region
    assert dag.inter_connection is False
