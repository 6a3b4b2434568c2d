"""The SkyPilot backend, offline.

- The exact `sky.Task` each launch hands SkyPilot is checked with SkyPilot's own schema.
- `--dryrun` runs SkyPilot's in-process dry run for real over the catalog snapshot (needs rsync).
- Only the SDK calls that talk to SkyPilot's API server are replaced, by `tests/fakesky.py`
  (the `fake_sky` fixture): bound to the real signatures, the client's own conversion run on
  what mncloud passes, answers through SkyPilot's own encoders and decoders; some answers are
  responses from `tests/data/skypilot/`, read strictly into SkyPilot's models.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from mncloud.backends.base import LaunchRequest, RunState
from mncloud.backends.registry import record_backend
from mncloud.backends.skypilot import (
    META_FILE,
    SkyPilotBackend,
    prefix_line,
    translate_error,
)
from mncloud.errors import BackendError, RunNotFoundError
from mncloud.layout import run_dir
from mncloud.operate import newest_checkpoint_step
from mncloud.render import render
from mncloud.request import build_spec
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture

if TYPE_CHECKING:
    from tests.fakesky import FakeSky

pytestmark = pytest.mark.catalog

DATA = Path(__file__).parent / "data" / "skypilot"
SECRET_VALUE = "hf_s3cr3t_value_never_in_files"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def _request(script: Path, *, spot: bool, dryrun: bool = False, **flags: Any) -> LaunchRequest:
    from mncloud.plan import PlanRequest, make_plan

    spec = build_spec(script, gpus="H100:8", nodes=4, spot=spot, name="llm", **flags)
    plan = make_plan(PlanRequest.from_spec(spec))
    return LaunchRequest(spec=spec, task=render(spec, plan=plan), plan=plan, dryrun=dryrun)


def _check_with_skypilot_schema(task: Any) -> dict[str, Any]:
    from sky.utils import common_utils, schemas

    config = task.to_yaml_config()  # what the SDK serialises and sends to the API server
    public = {k: v for k, v in copy.deepcopy(config).items() if not k.startswith("_")}
    common_utils.validate_schema(public, schemas.get_task_schema(), "")
    return config


# ------------------------------------------------------------------------------- launch


@pytest.mark.slow
def test_on_demand_launch_is_a_managed_job_with_job_recovery(
    script: Path, fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every cloud run is a managed job (issue #33): on demand too, recovered after a lost VM
    and after `--max-restarts` errors; no plain cluster is launched (`sky.launch` is for
    `up --cluster` only, tests/test_exec.py)."""
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    fake_sky.next_job_id = 7
    request = _request(
        script, spot=False, bucket="s3://team-ckpt", secret=["HF_TOKEN"], max_restarts=2
    )
    record_backend("llm", "skypilot")

    status = SkyPilotBackend().launch(request)

    ((args, kwargs),) = fake_sky.called("jobs.launch")
    assert kwargs == {"name": "llm"} and not fake_sky.called("launch")  # no plain cluster
    task = args[0]
    config = _check_with_skypilot_schema(task)
    assert task.num_nodes == 4
    choice = request.plan.choice
    ordered = config["resources"]["ordered"]
    assert ordered[0]["instance_type"] == choice.instance_type
    assert ordered[0]["infra"].lower() == f"{choice.cloud}/{choice.region}".lower()
    assert all(not r.use_spot for r in task.resources)
    recovery = {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 2,
        "recover_on_exit_codes": [115, 75],
    }
    assert all(entry["job_recovery"] == recovery for entry in ordered)
    # What SkyPilot's server loaded from the YAML the client sent: the same recovery.
    (sent,) = fake_sky.job(7).dag.tasks
    assert all(r.job_recovery == recovery and not r.use_spot for r in sent.resources)
    assert fake_sky.job(7).tasks[0].max_restarts == 2
    assert task.envs["MNCLOUD_CKPT_URI"] == "s3://team-ckpt/llm"
    assert "HF_TOKEN" not in task.envs and task.managed_secret_refs == []
    assert task.secrets["HF_TOKEN"].get_secret_value() == SECRET_VALUE
    assert status.state is RunState.PENDING and status.cloud == choice.cloud
    assert "managed job 7, on-demand" in status.detail
    meta = json.loads((run_dir("llm") / META_FILE).read_text())
    assert meta["kind"] == "managed-job" and meta["job_id"] == 7 and meta["max_restarts"] == 2
    assert meta["hourly_per_node"] == pytest.approx(choice.hourly_per_node)
    assert SECRET_VALUE not in "".join(p.read_text() for p in run_dir("llm").iterdir())


def test_spot_launch_is_a_managed_job_with_failover(script: Path, fake_sky: FakeSky) -> None:
    fake_sky.next_job_id = 7
    request = _request(script, spot=True, bucket="gs://team-ckpt", max_restarts=5)

    status = SkyPilotBackend().launch(request)

    ((args, kwargs),) = fake_sky.called("jobs.launch")
    assert kwargs == {"name": "llm"} and not fake_sky.called("launch")  # no plain cluster
    task = args[0]
    config = _check_with_skypilot_schema(task)
    assert task.num_nodes == 4
    assert all(r.use_spot for r in task.resources)
    recovery = {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 5,
        "recover_on_exit_codes": [115, 75],
    }
    ordered = config["resources"]["ordered"]  # SkyPilot copies job_recovery into each entry
    assert len(ordered) > 1 and all(entry["job_recovery"] == recovery for entry in ordered)
    assert ordered[0]["instance_type"] == request.plan.choice.instance_type
    assert status.state is RunState.PENDING and status.spot is True
    assert json.loads((run_dir("llm") / META_FILE).read_text())["job_id"] == 7


def test_a_secret_missing_from_the_environment_stops_the_launch(
    script: Path, fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    request = _request(script, spot=False, secret=["WANDB_API_KEY"])
    with pytest.raises(BackendError, match="WANDB_API_KEY is not set in your environment"):
        SkyPilotBackend().launch(request)
    assert fake_sky.calls == []


def test_no_capacity_becomes_one_line_with_advice(script: Path, fake_sky: FakeSky) -> None:
    from sky import exceptions as sx

    fake_sky.answers["jobs.launch"] = sx.ResourcesUnavailableError(
        "Failed to provision all possible launchable resources.\nRelax the task's resource "
        "requirements: 4x Lambda(gpu_8x_h100_sxm5)"
    )
    request = _request(script, spot=False)
    with pytest.raises(BackendError) as caught:
        SkyPilotBackend().launch(request)
    message = str(caught.value)
    assert "\n" not in message and "no capacity" in message and "--on-demand" in message
    status = SkyPilotBackend().status("llm")  # the failure is remembered
    assert status.state is RunState.FAILED and "no capacity" in status.detail


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda sx: sx.ApiServerConnectionError("http://127.0.0.1:46580"), "sky api start"),
        (lambda sx: sx.NoCloudAccessError("no cloud"), "sky check"),
        (lambda sx: sx.InvalidCloudCredentials("AWS: expired token"), "sky check"),
        (
            lambda sx: sx.ResourcesUnavailableError("Quota exceeded for NVIDIA_H100_GPUS"),
            "quota increase",
        ),
        (lambda sx: sx.NotSupportedError("Lambda does not support spot"), "does not support"),
        (lambda sx: RuntimeError("boom\n  at line 3"), "RuntimeError: boom at line 3"),
    ],
)
def test_skypilot_errors_are_translated(make: Callable[[Any], Exception], expected: str) -> None:
    from sky import exceptions as sx

    error = translate_error(make(sx), "launch cluster llm")
    assert isinstance(error, BackendError)
    assert expected in str(error) and "\n" not in str(error)


# ------------------------------------------------------------------------------ dry run


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
@pytest.mark.parametrize("spot", [False, True])
def test_dryrun_runs_skypilot_for_real(
    script: Path,
    spot: bool,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sky
    import sky.jobs

    def forbidden(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a dry run must not provision")

    monkeypatch.setattr(sky, "launch", forbidden)
    monkeypatch.setattr(sky.jobs, "launch", forbidden)
    request = _request(script, spot=spot, dryrun=True)

    status = SkyPilotBackend().launch(request)

    assert "dry run passed" in status.detail and "nothing was provisioned" in status.detail
    assert status.cloud in {c.lower() for c in sky_enabled_clouds}
    assert status.region and status.instance_type and status.spot is spot
    assert not (run_dir("llm") / META_FILE).exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
def test_cli_up_dryrun(
    script: Path,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mncloud.cli import app

    monkeypatch.chdir(script.parent)
    args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "4", "--on-demand", "--dryrun"]
    result = CliRunner().invoke(app, [*args, "--name", "llm"])
    assert result.exit_code == 0, result.output
    assert "dry run passed" in result.output


@pytest.mark.slow
def test_cli_up_dryrun_without_credentials_shows_what_it_can(script: Path, tmp_path: Path) -> None:
    """No cloud set up (a fresh SkyPilot state): the plan and the task are still checked and
    shown, and the user learns what SkyPilot's own dry run needs. Exit 0, nothing launched."""
    import os
    import subprocess
    import sys

    env = os.environ | {"SKY_RUNTIME_DIR": str(tmp_path / "fresh-sky"), "COLUMNS": "80"}
    args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "2", "--dryrun", "--name", "llm"]
    proc = subprocess.run(
        [sys.executable, "-m", "mncloud", *args],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wins at" in proc.stdout  # the plan
    assert "num_nodes: 2" in proc.stdout and "torchrun" in proc.stdout  # the task
    assert "plan and task are valid" in proc.stdout and "sky check" in proc.stdout
    assert not (Path(env["MNCLOUD_HOME"]) / "runs" / "llm").exists()


# ------------------------------------------------------------------------------- status


def _launched(script: Path, fake_sky: FakeSky, *, spot: bool, **flags: Any) -> SkyPilotBackend:
    fake_sky.next_job_id = 7
    backend = SkyPilotBackend()
    record_backend("llm", "skypilot")
    backend.launch(_request(script, spot=spot, **flags))
    return backend


def _cluster(fake: FakeSky, name: str, job_state: Any) -> None:
    """The cluster `llm` as `tests/data/skypilot/<name>` records it, its job 1 in `job_state`."""
    from sky.schemas.api import responses

    from tests.fakesky import strict_records

    (record,) = json.loads((DATA / name).read_text())
    strict_records(responses.StatusResponse, [record])
    fake.add_cluster("llm", record, {1: job_state})


def _legacy_cluster_run(
    fake: FakeSky, script: Path, job_state: Any = None, **flags: Any
) -> SkyPilotBackend:
    """An on-demand run an older mncloud launched as a cluster (`sky.launch`): its record
    as that mncloud wrote it, and its cluster `llm` up with job 1 in `job_state`."""
    from mncloud.backends.skypilot.meta import CLUSTER, meta_from_plan, save_meta

    request = _request(script, spot=False, **flags)
    meta = meta_from_plan(request.spec, request.plan, False, request.task.config)
    meta.kind, meta.job_id, meta.max_restarts = CLUSTER, 1, None
    save_meta(meta)
    record_backend("llm", "skypilot")
    _cluster(fake, "status_cluster_up.json", job_state)
    return SkyPilotBackend()


def _job_records(name: str) -> list[Any]:
    from sky.schemas.api import responses

    from tests.fakesky import strict_records

    return strict_records(responses.ManagedJobRecord, json.loads((DATA / name).read_text()))


def _write_complete_step(uri: str, step: int, tmp_path: Path) -> None:
    from mncloud.storage import CheckpointStore, Manifest

    store = CheckpointStore(uri)
    shard = tmp_path / f"shard-{step}.bin"
    shard.write_bytes(b"x" * 64)
    entries = store.upload(step, {"__0_0.distcp": shard})
    store.commit(Manifest(step=step, world_size=1, files=entries))


def test_legacy_cluster_status_running_with_checkpoint_and_cost(
    script: Path, fake_sky: FakeSky, tmp_path: Path
) -> None:
    from sky.skylet import job_lib

    bucket = tmp_path / "bucket"
    backend = _legacy_cluster_run(
        fake_sky, script, job_lib.JobStatus.RUNNING, bucket=f"file://{bucket}"
    )
    _write_complete_step(f"file://{bucket}/llm", 200, tmp_path)

    status = backend.status("llm")

    ((args, _kw),) = fake_sky.called("job_status")
    assert args == ("llm", [1])
    assert status.state is RunState.RUNNING
    assert (status.cloud, status.region, status.nodes) == ("Lambda", "us-east-1", 4)
    assert status.ckpt_uri == f"file://{bucket}/llm"
    assert newest_checkpoint_step(status.ckpt_uri) == 200
    assert status.hourly_total and status.cost_so_far is not None and status.cost_so_far >= 0


def test_status_command_shows_the_newest_checkpoint(
    script: Path, fake_sky: FakeSky, tmp_path: Path
) -> None:
    from sky.skylet import job_lib

    from mncloud.cli import app

    bucket = tmp_path / "bucket"
    _legacy_cluster_run(fake_sky, script, job_lib.JobStatus.RUNNING, bucket=f"file://{bucket}")
    _write_complete_step(f"file://{bucket}/llm", 100, tmp_path)
    _write_complete_step(f"file://{bucket}/llm", 200, tmp_path)

    result = CliRunner().invoke(app, ["status", "llm", "--json"])

    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["ckpt_step"] == 200 and row["state"] == "RUNNING"
    assert row["cost_so_far"] is not None
    table = CliRunner().invoke(app, ["status", "llm"], env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    header = next(line for line in table.stdout.splitlines() if "state" in line)
    assert "started" in header and "ran" in header and "age" not in header
    assert " ago " in table.stdout and "200" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80


def test_legacy_cluster_status_while_provisioning(script: Path, fake_sky: FakeSky) -> None:
    backend = _legacy_cluster_run(fake_sky, script)
    _cluster(fake_sky, "status_cluster_init.json", None)
    assert backend.status("llm").state is RunState.STARTING


def test_legacy_cluster_gone_after_success_keeps_the_last_state(
    script: Path, fake_sky: FakeSky
) -> None:
    from sky.skylet import job_lib

    backend = _legacy_cluster_run(fake_sky, script, job_lib.JobStatus.SUCCEEDED)
    assert backend.status("llm").state is RunState.SUCCEEDED
    del fake_sky.clusters["llm"]  # autodown after the idle minutes
    status = backend.status("llm")
    assert status.state is RunState.SUCCEEDED and "torn down" in status.detail


def test_managed_job_status_counts_recoveries(
    script: Path, fake_sky: FakeSky, tmp_path: Path
) -> None:
    backend = _launched(script, fake_sky, spot=True, bucket=f"file://{tmp_path / 'b'}")
    fake_sky.answers["jobs.queue_v2"] = (_job_records("jobs_queue_recovering.json"), 1, {}, 1)

    status = backend.status("llm")

    ((_args, kwargs),) = fake_sky.called("jobs.queue_v2")
    assert kwargs["job_ids"] == [7]
    assert status.state is RunState.RECOVERING and status.restarts == 2
    assert (status.cloud, status.region) == ("AWS", "us-east-1")
    assert status.started_at == pytest.approx(1763700420.5)
    assert "2 recoveries" in status.detail
    assert status.ckpt_uri and newest_checkpoint_step(status.ckpt_uri) is None


def test_managed_job_failure_reason_is_shown(script: Path, fake_sky: FakeSky) -> None:
    backend = _launched(script, fake_sky, spot=True)
    fake_sky.answers["jobs.queue_v2"] = (
        _job_records("jobs_queue_failed_no_resource.json"),
        1,
        {},
        1,
    )
    status = backend.status("llm")
    assert status.state is RunState.FAILED
    assert "Failed to acquire resources" in status.detail
    assert status.ended_at == pytest.approx(1763703600.0)


# --------------------------------------------------------------------------- logs, down


def test_legacy_cluster_logs_are_prefixed_by_node_and_filtered(
    script: Path, fake_sky: FakeSky
) -> None:
    backend = _legacy_cluster_run(fake_sky, script)
    fake_sky.logs["llm", None] = (DATA / "logs_cluster_two_nodes.txt").read_text()
    lines = list(backend.logs("llm", follow=True))
    assert fake_sky.called("tail_logs")[0] == (
        ("llm", 1),
        {"follow": True, "preload_content": False},
    )
    assert "[node 0] step 100 loss 2.31" in lines
    assert "[node 1] mncloud: node 1 of 2, torchrun starting" in lines
    assert lines[-1] == "[sky] ✓ Job finished (status: SUCCEEDED)."
    only_one = list(backend.logs("llm", node=1))
    assert only_one == [
        "[node 1] mncloud: node 1 of 2, torchrun starting",
        "[node 1] step 100 loss 2.31",
    ]


def test_managed_job_logs(script: Path, fake_sky: FakeSky) -> None:
    backend = _launched(script, fake_sky, spot=True)
    fake_sky.logs[7, None] = "(head, rank=0, pid=9) resumed from step 200\n"
    assert list(backend.logs("llm")) == ["[node 0] resumed from step 200"]
    assert fake_sky.called("jobs.tail_logs") == [
        ((), {"job_id": 7, "follow": False, "preload_content": False})
    ]


def test_prefix_line_single_node() -> None:
    assert prefix_line("(llm, pid=12) hello") == (0, "[node 0] hello")


def test_down_legacy_cluster_is_idempotent(script: Path, fake_sky: FakeSky) -> None:
    backend = _legacy_cluster_run(fake_sky, script)
    status = backend.down("llm")
    assert fake_sky.called("down") == [(("llm",), {})] and "llm" not in fake_sky.clusters
    assert status.state is RunState.CANCELLED and status.ended_at is not None
    assert backend.down("llm").state is RunState.CANCELLED  # SkyPilot: no such cluster


def test_down_managed_job_cancels_it(script: Path, fake_sky: FakeSky) -> None:
    from sky.jobs import ManagedJobStatus

    backend = _launched(script, fake_sky, spot=True)
    fake_sky.set_status(7, ManagedJobStatus.RUNNING)
    status = backend.down("llm")
    assert fake_sky.called("jobs.cancel") == [((), {"job_ids": [7]})]
    assert status.state is RunState.CANCELLED
    assert fake_sky.job(7).tasks[0].status is ManagedJobStatus.CANCELLED


def test_unknown_run_has_no_record() -> None:
    with pytest.raises(RunNotFoundError):
        SkyPilotBackend().status("never-launched")


@pytest.mark.slow
@pytest.mark.nodes_answer  # a real node process answers the notice: wall time
def test_down_gives_a_running_job_a_stop_notice_and_keeps_the_step_it_saved(
    script: Path, fake_sky: FakeSky, tmp_path: Path
) -> None:
    """`down` of a running managed job: a stop request in the bucket, read by a real training
    process (as on a node), which saves the step it reached and exits; then the job is
    cancelled and the request cleared. The cloud's VMs are the only thing faked."""
    import subprocess
    import sys

    from sky.jobs import ManagedJobStatus

    from mncloud.storage import CheckpointStore
    from mncloud.storage.stoprequest import read_stop_request
    from tests.test_stop_request import NODE, node_env

    backend = _launched(script, fake_sky, spot=True, bucket=f"file://{tmp_path / 'b'}")
    fake_sky.set_status(7, ManagedJobStatus.RUNNING)
    ckpt_uri = backend.status("llm").ckpt_uri
    assert ckpt_uri and backend.status("llm").state is RunState.RUNNING
    node = subprocess.Popen(
        [sys.executable, "-c", NODE], env=node_env(ckpt_uri, tmp_path), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert node.stdout is not None and node.stdout.readline().strip() == "ready"

    status = backend.down("llm", notice_s=30)

    _, err = node.communicate(timeout=60)
    assert node.returncode == 115, err  # it had saved when down cancelled the job
    step, _ = CheckpointStore(ckpt_uri).latest()
    assert step is not None and f"stopped after a 30s notice (step {step} saved)" in status.detail
    assert fake_sky.called("jobs.cancel") == [((), {"job_ids": [7]})]
    assert read_stop_request(CheckpointStore(ckpt_uri)) is None  # nothing left to stop a rerun


def test_down_now_gives_no_notice(script: Path, fake_sky: FakeSky, tmp_path: Path) -> None:
    from mncloud.storage import CheckpointStore
    from mncloud.storage.stoprequest import read_stop_request

    backend = _launched(script, fake_sky, spot=False, bucket=f"file://{tmp_path / 'b'}")
    ckpt_uri = backend.status("llm").ckpt_uri
    status = backend.down("llm")  # notice_s 0: `down --now`
    assert "notice" not in status.detail and fake_sky.called("jobs.cancel") == [
        ((), {"job_ids": [7]})
    ]
    assert ckpt_uri and read_stop_request(CheckpointStore(ckpt_uri)) is None
