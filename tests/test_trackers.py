"""#59: one tracker run per training run. The variables every node gets (W&B's run id and
resume, its group under node recovery, the TensorBoard folder in `--ckpt-dir`), the MLflow run
`up` creates on a real `mlflow server` (sqlite, a local artifact root), a server that does not
answer, and `--tracker none`."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mncloud import constants
from mncloud.records import mlflowrun
from mncloud.render import task_env
from mncloud.render.trackers import WANDB_ID_MAX, tb_dir, wandb_run_id
from mncloud.request import build_spec
from tests.servers import free_port

RUN_ID = "train-20261202T030000-abc123"
TRACKER_VARS = {
    constants.WANDB_RUN_ID_ENV, constants.WANDB_RESUME_ENV, constants.WANDB_RUN_GROUP_ENV,
    constants.MLFLOW_RUN_ID_ENV, constants.TB_DIR_ENV, constants.TRACKER_OFF_ENV,
}  # fmt: skip


def _spec(project: Path, **flags: Any) -> Any:
    return build_spec(project / "train.py", cloud="local", gpus="cpu:1", **flags)


@pytest.fixture
def no_user_trackers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*TRACKER_VARS, constants.MLFLOW_TRACKING_URI_ENV, "WANDB_JOB_TYPE"):
        monkeypatch.delenv(name, raising=False)


def test_every_attempt_gets_the_same_wandb_run_and_resumes_it(
    project: Path, no_user_trackers: None
) -> None:
    env = task_env(_spec(project), spot=False, run_id=RUN_ID)
    assert env[constants.WANDB_RUN_ID_ENV] == RUN_ID
    assert env[constants.WANDB_RESUME_ENV] == "allow"
    assert constants.WANDB_RUN_GROUP_ENV not in env and constants.TB_DIR_ENV not in env
    assert env == task_env(_spec(project), spot=False, run_id=RUN_ID)  # a relaunch's


def test_a_wandb_run_id_is_at_most_64_characters_without_a_slash() -> None:
    long = "x" * 63 + "-20261202T030000-abc123"
    made = wandb_run_id(long)
    assert len(made) <= WANDB_ID_MAX and "/" not in made and made.startswith("x" * 40)
    assert made != wandb_run_id(long[:-1] + "4")  # still one per run
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", wandb_run_id("a/b c")), wandb_run_id("a/b c")
    assert len(wandb_run_id(long, room=6)) <= WANDB_ID_MAX - 6


def test_the_users_own_setting_wins(
    project: Path, no_user_trackers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = task_env(_spec(project, env=["WANDB_RUN_ID=mine"]), spot=False, run_id=RUN_ID)
    assert env[constants.WANDB_RUN_ID_ENV] == "mine"
    monkeypatch.setenv(constants.WANDB_RESUME_ENV, "must")  # a local node inherits it
    env = task_env(_spec(project), spot=False, run_id=RUN_ID)
    assert constants.WANDB_RESUME_ENV not in env


def test_the_tensorboard_folder_is_a_logger_folder_in_ckpt_dir(
    project: Path, no_user_trackers: None, tmp_path: Path
) -> None:
    from mncloud.storage.folders import is_log

    spec = _spec(project, ckpt_dir="/ckpt/out", bucket=(tmp_path / "b").as_uri())
    env = task_env(spec, spot=False, run_id=RUN_ID)
    assert env[constants.TB_DIR_ENV] == tb_dir("/ckpt/out") == "/ckpt/out/tensorboard"
    assert is_log(Path(env[constants.TB_DIR_ENV]).name)  # synced file by file, restored


def test_tracker_none_sets_nothing(project: Path, no_user_trackers: None) -> None:
    on = task_env(_spec(project), spot=False, run_id=RUN_ID)
    off = task_env(_spec(project, tracker="none"), spot=False, run_id=RUN_ID)
    assert set(off) - set(on) == {constants.TRACKER_OFF_ENV}
    assert not (set(off) & (TRACKER_VARS - {constants.TRACKER_OFF_ENV}))


def test_an_unknown_tracker_choice_is_one_line(project: Path) -> None:
    from mncloud.errors import SpecError

    with pytest.raises(SpecError, match="--tracker 'mlflow' is unknown; choose one of: auto, none"):
        _spec(project, tracker="mlflow")


def test_node_recovery_groups_each_nodes_wandb_run(
    project: Path, no_user_trackers: None, tmp_path: Path
) -> None:
    from mncloud.spec import Recovery

    spec = _spec(project, nodes=2, bucket=(tmp_path / "b").as_uri()).updated(recovery=Recovery.NODE)
    env = task_env(spec, spot=False, run_id=RUN_ID)
    assert env[constants.WANDB_RUN_GROUP_ENV] == RUN_ID
    assert constants.WANDB_RUN_ID_ENV not in env  # run.sh: `<group>-n<replica>` per node


def test_up_creates_one_mlflow_run_tagged_with_the_run(
    project: Path, no_user_trackers: None, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mlflowrun.TIMEOUT_ENV, "120")  # a loaded test machine: no race
    spec = _spec(project, env=[f"MLFLOW_TRACKING_URI={mlflow_server}",
                               "MLFLOW_EXPERIMENT_NAME=mncloud-tests"])  # fmt: skip
    said: list[str] = []
    made = mlflowrun.with_mlflow_run(spec, RUN_ID, said.append)
    assert said == []
    run_id = made.envs[constants.MLFLOW_RUN_ID_ENV]
    env = task_env(made, spot=False, run_id=RUN_ID)
    assert env[constants.MLFLOW_RUN_ID_ENV] == run_id
    run = mlflowrun.call(mlflow_server, f"runs/get?run_id={run_id}")["run"]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags[mlflowrun.TAG_RUN_ID] == RUN_ID and tags[mlflowrun.TAG_CLOUD] == "local"
    assert tags[mlflowrun.TAG_GPUS] == "cpu:1" and tags["mlflow.runName"] == RUN_ID
    experiment = mlflowrun.experiment_id(mlflow_server, "mncloud-tests")
    assert run["info"]["experiment_id"] == experiment
    # The user's own run wins: none created.
    again = mlflowrun.with_mlflow_run(made, RUN_ID, said.append)
    assert again.envs[constants.MLFLOW_RUN_ID_ENV] == run_id
    found = mlflowrun.call(mlflow_server, "runs/search", {"experiment_ids": [experiment]})
    assert len(found["runs"]) == 1


def test_up_resume_logs_into_the_earlier_mlflow_run_while_the_server_holds_it(
    project: Path, no_user_trackers: None, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up --resume`: the MLflow run of the run's newest record, not a new one; once that run
    is deleted on the server, a new one."""
    from mncloud.records.store import create_record

    monkeypatch.setenv(mlflowrun.TIMEOUT_ENV, "120")
    spec = _spec(project, env=[f"MLFLOW_TRACKING_URI={mlflow_server}",
                               "MLFLOW_EXPERIMENT_NAME=resumes"])  # fmt: skip
    first = mlflowrun.with_mlflow_run(spec, RUN_ID, pytest.fail)
    create_record(first, "name: t\n", None, "local", run_id=RUN_ID)
    earlier = first.envs[constants.MLFLOW_RUN_ID_ENV]
    again = mlflowrun.with_mlflow_run(spec, f"{RUN_ID}-2", pytest.fail, resume=True)
    assert again.envs[constants.MLFLOW_RUN_ID_ENV] == earlier
    fresh = mlflowrun.with_mlflow_run(spec, f"{RUN_ID}-3", pytest.fail)  # no --resume
    assert fresh.envs[constants.MLFLOW_RUN_ID_ENV] != earlier
    mlflowrun.call(mlflow_server, "runs/delete", {"run_id": earlier})
    after = mlflowrun.with_mlflow_run(spec, f"{RUN_ID}-4", pytest.fail, resume=True)
    made = after.envs[constants.MLFLOW_RUN_ID_ENV]
    assert made != earlier and mlflowrun.run_info(mlflow_server, made) is not None


def test_an_mlflow_server_that_does_not_answer_is_one_warning(
    project: Path, no_user_trackers: None
) -> None:
    uri = f"http://user:hunter2@127.0.0.1:{free_port()}"
    spec = _spec(project, env=[f"MLFLOW_TRACKING_URI={uri}"], allow_secret_env=True)
    said: list[str] = []
    assert mlflowrun.with_mlflow_run(spec, RUN_ID, said.append) is spec
    assert len(said) == 1 and said[0].startswith("warning: MLflow at http://127.0.0.1:"), said
    assert "hunter2" not in said[0]
    assert said[0].endswith("did not answer (Connection refused); training without it"), said


def test_tracker_none_creates_no_mlflow_run(project: Path, no_user_trackers: None) -> None:
    spec = _spec(
        project, tracker="none", env=[f"MLFLOW_TRACKING_URI=http://127.0.0.1:{free_port()}"]
    )
    said: list[str] = []
    assert mlflowrun.with_mlflow_run(spec, RUN_ID, said.append) is spec and said == []


def _preflight(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m mncloud.doctor node` on this machine as a node of 1 (CPU), with `env`."""
    base = {k: v for k, v in os.environ.items() if k not in TRACKER_VARS}
    base.update({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1", **env})
    return subprocess.run(
        [sys.executable, "-m", "mncloud.doctor", "node", "--workdir", str(tmp_path)],
        env=base, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_tracker_package_missing_on_a_node_is_named_in_the_preflight(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("mlflow") is not None:
        pytest.skip("mlflow is installed here: the node this test needs lacks it")
    done = _preflight(tmp_path, MLFLOW_RUN_ID="abc123")
    assert done.returncode == 0, done.stderr  # a warning: the training goes on
    lines = [line for line in done.stderr.splitlines() if "'mlflow'" in line]
    assert lines == [
        "preflight: warning on node 0: MLFLOW_RUN_ID asks for MLflow but the 'mlflow' package "
        "is not installed here: pip install mlflow (in --setup or --requirements); the script "
        "trains without logging to it"
    ], done.stderr
    quiet = _preflight(tmp_path)  # no tracker asked for: nothing said
    assert quiet.returncode == 0 and "tracker" not in quiet.stderr.lower(), quiet.stderr
    off = _preflight(tmp_path, MLFLOW_RUN_ID="abc123", MNCLOUD_TRACKER_OFF="1")
    assert "'mlflow'" not in off.stderr, off.stderr


# --------------------------------------------------------------------------- Lightning, TensorBoard


def _lightning_attempt(
    folder: Path, max_steps: int, resume: Path | None, logger: Any = True
) -> None:
    """One attempt of the Lightning example (its default TensorBoard logger, a loss logged
    every step, mncloud's callback as the site hook adds it), from checkpoint `resume`."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        import lightning_train as example
    finally:
        sys.path.pop(0)
    from mncloud.train.pl import MncloudCallback

    L.seed_everything(0, workers=True)
    saves = ModelCheckpoint(dirpath=folder / "ckpt", every_n_train_steps=4, save_top_k=-1)
    fit = L.Trainer(
        max_steps=max_steps, deterministic=True, default_root_dir=folder, log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, logger=logger,
        callbacks=[saves, MncloudCallback()],
    )  # fmt: skip
    loader = example.DataLoader(example.data(128), batch_size=32, shuffle=False)
    fit.fit(example.Regressor(), loader, ckpt_path=str(resume) if resume else None)


def _tb_scalars(folder: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return list(events.Tags()["scalars"])


def _tb_losses(folder: Path) -> list[tuple[int, float]]:
    """The `loss` scalars TensorBoard shows for `folder` (its own reader, orphans purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), purge_orphaned_data=True)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("loss")]


def _ckpt_of(folder: Path, step: int) -> Path:
    (found,) = (folder / "ckpt").glob(f"*step={step}.ckpt")
    return found


def test_a_lightning_run_preempted_twice_shows_each_step_once_in_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts that log past their last checkpoint (7 steps, saved at 4; then to 11, saved
    at 8) and a last one to 16: one TensorBoard folder, each step once, the uninterrupted
    run's values."""
    pytest.importorskip("lightning")
    pytest.importorskip("tensorboard")
    for name in TRACKER_VARS:
        monkeypatch.delenv(name, raising=False)
    straight, run = tmp_path / "straight", tmp_path / "run"
    _lightning_attempt(straight, 16, None)
    expected = _tb_losses(straight / "lightning_logs" / "version_0")
    assert [s for s, _ in expected] == list(range(16)), expected

    monkeypatch.setenv(constants.TB_DIR_ENV, str(run / "tensorboard"))
    monkeypatch.setenv(constants.RUN_NAME_ENV, "lit")
    _lightning_attempt(run, 7, None)  # preempted after step 7, its last save at 4
    _lightning_attempt(run, 11, _ckpt_of(run, 4))  # preempted again: saved at 8
    _lightning_attempt(run, 16, _ckpt_of(run, 8))
    left = [p for p in (run / "lightning_logs").rglob("*") if p.is_file()]
    assert all(_tb_scalars(p.parent) == [] for p in left), left  # what Lightning opened, empty
    got = _tb_losses(run / "tensorboard" / "lit")
    assert [s for s, _ in got] == list(range(16)), got
    assert [v for _, v in got] == pytest.approx([v for _, v in expected])


def _wandb_offline_runs(folder: Path) -> list[tuple[str, list[int]]]:
    """Each offline run under `folder`: its run id and history steps, read with W&B's own
    reader of its `.wandb` files."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    found = []
    for path in sorted(folder.glob("wandb/offline-run-*/*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(path))
        run_ids, steps, kinds = [], [], []
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kinds.append(kind := record.WhichOneof("record_type"))
            if kind == "run":
                run_ids.append(record.run.run_id)
            elif kind == "history":
                steps.append(record.history.step.num)
        assert run_ids, (path, path.stat().st_size, kinds)
        found.append((run_ids[0], steps))
    return found


def test_every_attempt_of_a_lightning_run_logs_into_the_same_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: Path, no_user_trackers: None
) -> None:
    """Lightning's `WandbLogger`, as a script makes it, offline: the first attempt and the one
    resumed after a preemption each write an offline run, both with the run's W&B id (from
    `task_env`, what every node gets)."""
    pytest.importorskip("lightning")
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    for key, value in task_env(_spec(project), spot=False, run_id=RUN_ID).items():
        if key.startswith("WANDB_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for max_steps, resume in ((6, None), (12, 4)):
        ckpt = _ckpt_of(tmp_path, resume) if resume else None
        _lightning_attempt(tmp_path, max_steps, ckpt, WandbLogger(save_dir=tmp_path))
        wandb.finish()
    wandb.teardown()  # W&B's service has written every record before it is read back
    runs = _wandb_offline_runs(tmp_path)
    assert [run_id for run_id, _ in runs] == [RUN_ID, RUN_ID], runs
    # Offline, W&B numbers each run's rows from 0: 6 steps, then the 8 after step 4.
    assert (len(runs[0][1]), len(runs[1][1])) == (6, 8), runs


# --------------------------------------------------------------------------- on local nodes

ENV_SCRIPT = """\
import json, os, sys, time
from pathlib import Path
names = {names!r}
rank = os.environ["RANK"]
print("TRACKERS", rank, json.dumps({{n: os.environ.get(n) for n in names}}), flush=True)
marker = Path(sys.argv[1]) / f"rank{{rank}}"
if not marker.exists():  # the first attempt waits to be preempted
    marker.touch()
    time.sleep(300)
"""


def _seen(name: str) -> list[dict[str, str | None]]:
    from tests.test_local import run_log

    lines = [line.split("TRACKERS ", 1)[1] for line in run_log(name).splitlines()
             if "TRACKERS " in line]  # fmt: skip
    import json

    return [json.loads(line.split(" ", 1)[1]) for line in lines]


@pytest.mark.slow
def test_every_attempt_on_every_rank_of_a_local_run_gets_the_same_wandb_run(
    project: Path, tmp_path: Path, no_user_trackers: None
) -> None:
    """2 local nodes, preempted once: all 4 ranks' environments (2 per attempt) name the
    same W&B run, the run's id; `--tracker none`: none of it, and the marker that says so."""
    from tests.test_local import cli, up, wait_final, wait_until

    names = [*sorted(TRACKER_VARS), constants.RUN_ID_ENV]
    script = project / "envs.py"
    script.write_text(ENV_SCRIPT.format(names=names))
    markers = tmp_path / "markers"
    markers.mkdir()
    flags = ("--nodes", "2", "--gpus", "cpu:1", "--recovery-delay", "0.5s")
    up("trk", script, *flags, script_args=[str(markers)])
    wait_until(lambda: len(_seen("trk")) == 2, 240, "the first attempt's ranks")
    cli("chaos", "preempt", "trk")
    state = wait_final("trk")
    assert (state.state.value, state.preemptions) == ("SUCCEEDED", 1)
    seen = _seen("trk")
    assert len(seen) == 4, seen
    run_id = seen[0][constants.RUN_ID_ENV]
    assert run_id and run_id.startswith("trk-")
    for env in seen:
        assert env[constants.WANDB_RUN_ID_ENV] == wandb_run_id(run_id), env
        assert env[constants.WANDB_RESUME_ENV] == "allow", env
        assert env[constants.TRACKER_OFF_ENV] is None, env

    quiet = tmp_path / "quiet"
    quiet.mkdir()
    for rank in (0, 1):
        (quiet / f"rank{rank}").touch()  # no preemption wait
    up("trk-off", script, *flags, "--tracker", "none", script_args=[str(quiet)])
    assert wait_final("trk-off").state.value == "SUCCEEDED"
    for env in _seen("trk-off"):
        assert {k for k, v in env.items() if v} == {constants.RUN_ID_ENV,
                                                    constants.TRACKER_OFF_ENV}, env  # fmt: skip


# --------------------------------------------------------------------------- MLflow, resumed


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """Metric `key` of MLflow run `run_id` as the server holds it (MLflow's own client)."""
    from mlflow.tracking import MlflowClient

    points = MlflowClient(uri).get_metric_history(run_id, key)
    return sorted((p.step, p.value) for p in points)


@pytest.fixture
def mlflow_hooked(monkeypatch: pytest.MonkeyPatch) -> Any:
    """MLflow's client and Lightning's `MLFlowLogger` wrapped as the site hook wraps them on a
    node (undone after the test); `relaunch()` forgets what a process read and remembers
    `MLFLOW_RUN_ID` again, as a relaunched attempt's new process does."""
    pytest.importorskip("mlflow")
    from mlflow.tracking._tracking_service import client

    from mncloud.train import mlflowhook

    cls = client.TrackingServiceClient
    monkeypatch.setattr(cls, "log_batch", cls.log_batch)
    monkeypatch.setattr(cls, "log_metric", cls.log_metric)
    mlflowhook.imported(client)
    monkeypatch.setattr(mlflowhook, "_process", {})
    with contextlib.suppress(ImportError):
        from lightning.pytorch.loggers import MLFlowLogger

        monkeypatch.setattr(MLFlowLogger, "__init__", MLFlowLogger.__init__)
        mlflowhook.joins_the_run(MLFlowLogger)
    monkeypatch.setattr(mlflowhook, "_held", {})

    def relaunch() -> None:
        mlflowhook._held.clear()
        mlflowhook._process.clear()
        mlflowhook.imported(client)  # where a new process's site hook remembers MLFLOW_RUN_ID

    return relaunch


def test_a_lightning_run_preempted_twice_logs_each_step_once_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: Path, no_user_trackers: None,
    mlflow_server: str, mlflow_hooked: Any,
) -> None:  # fmt: skip
    """Lightning's `MLFlowLogger` as a script makes it (no run id): attempts that log past
    their last checkpoint (7 steps, saved at 4; to 11, saved at 8; to 16) all log into the run
    `up` made, each step once, with the uninterrupted run's values; each resume is tagged."""
    pytest.importorskip("lightning")
    from lightning.pytorch.loggers import MLFlowLogger

    from mncloud.train import mlflowhook

    monkeypatch.setenv(constants.MLFLOW_TRACKING_URI_ENV, mlflow_server)
    monkeypatch.setenv(mlflowrun.TIMEOUT_ENV, "120")
    straight = tmp_path / "straight"
    reference = MLFlowLogger(experiment_name="straight", tracking_uri=mlflow_server)
    _lightning_attempt(straight, 16, None, reference)
    expected = _history(mlflow_server, reference.run_id, "loss")
    assert [s for s, _ in expected] == list(range(16)), expected

    spec = _spec(project, env=["MLFLOW_EXPERIMENT_NAME=lit"])
    mlflow_id = mlflowrun.with_mlflow_run(spec, RUN_ID, pytest.fail).envs["MLFLOW_RUN_ID"]
    monkeypatch.setenv(constants.MLFLOW_RUN_ID_ENV, mlflow_id)
    run = tmp_path / "run"
    for max_steps, resume in ((7, None), (11, 4), (16, 8)):
        mlflow_hooked()  # a relaunch: a new process
        logger = MLFlowLogger(tracking_uri=mlflow_server)  # the script's, unchanged
        _lightning_attempt(run, max_steps, _ckpt_of(run, resume) if resume else None, logger)
        assert logger.run_id == mlflow_id
    got = _history(mlflow_server, mlflow_id, "loss")
    assert [s for s, _ in got] == list(range(16)), got
    assert [v for _, v in got] == pytest.approx([v for _, v in expected])
    tags = mlflowrun.call(mlflow_server, f"runs/get?run_id={mlflow_id}")["run"]["data"]["tags"]
    assert {t["key"]: t["value"] for t in tags}[mlflowhook.RESUMED_TAG] == "4,8"
    assert [r["info"]["run_id"] for r in _mlflow_runs(mlflow_server, "lit")] == [mlflow_id]
    assert _mlflow_runs(mlflow_server, "lightning_logs") == []  # no run of the loggers' own


# --------------------------------------------------------------------------- links, figures


def _record(spec: Any, run_id: str = RUN_ID) -> Any:
    """A run record of `spec` (its task rendered, no plan), as `up` writes it."""
    from mncloud.records.store import create_record

    return create_record(spec, "name: t\n", None, "local", run_id=run_id, save=False)


def test_the_mlflow_link_names_the_run_and_never_a_credential(
    project: Path, no_user_trackers: None
) -> None:
    from mncloud.records.trackers import tracker_links

    spec = _spec(project, env=["MLFLOW_TRACKING_URI=https://mlflow.internal:5000/",
                               "MLFLOW_RUN_ID=abc123", "MLFLOW_EXPERIMENT_ID=7"])  # fmt: skip
    assert tracker_links(_record(spec)) == {
        "MLflow": "https://mlflow.internal:5000/#/experiments/7/runs/abc123"
    }
    secret = _spec(project, env=["MLFLOW_TRACKING_URI=https://me:hunter2@mlflow.internal",
                                 "MLFLOW_RUN_ID=abc123", "MLFLOW_EXPERIMENT_ID=7"],
                   allow_secret_env=True)  # fmt: skip
    (link,) = tracker_links(_record(secret)).values()
    assert link == "https://mlflow.internal/#/experiments/7/runs/abc123"
    off = _spec(project, tracker="none", env=["MLFLOW_TRACKING_URI=https://m", "MLFLOW_RUN_ID=a",
                                              "MLFLOW_EXPERIMENT_ID=7"])  # fmt: skip
    assert tracker_links(_record(off)) == {}


def test_a_wandb_link_only_when_its_entity_and_project_are_known(
    project: Path, no_user_trackers: None
) -> None:
    from mncloud.records.trackers import tracker_links

    assert tracker_links(_record(_spec(project, env=["WANDB_PROJECT=p"]))) == {}
    spec = _spec(project, env=["WANDB_ENTITY=team", "WANDB_PROJECT=p"])
    assert tracker_links(_record(spec)) == {"W&B": f"https://wandb.ai/team/p/runs/{RUN_ID}"}
    from mncloud.spec import Recovery

    nodes = spec.updated(recovery=Recovery.NODE)
    group = wandb_run_id(RUN_ID, room=6)
    assert tracker_links(_record(nodes)) == {"W&B": f"https://wandb.ai/team/p/groups/{group}"}


def test_figures_a_server_does_not_take_are_one_warning(
    project: Path, no_user_trackers: None
) -> None:
    from mncloud.records.trackers import post_figures

    uri = f"http://127.0.0.1:{free_port()}"
    spec = _spec(project, env=[f"MLFLOW_TRACKING_URI={uri}", "MLFLOW_RUN_ID=abc123"])
    said = post_figures(_record(spec))
    assert said is not None and said.startswith(f"warning: mncloud's figures not sent to MLflow "
                                                f"at {uri} (")  # fmt: skip
    assert post_figures(_record(_spec(project))) is None  # no MLflow run: nothing sent


PREEMPTED_ONCE = """\
import sys, time
from pathlib import Path
marker = Path(sys.argv[1]) / "started"
if not marker.exists():  # the first attempt waits to be preempted
    marker.touch()
    time.sleep(300)
"""


def _mlflow_run(uri: str, mlflow_id: str) -> dict[str, Any]:
    return dict(mlflowrun.call(uri, f"runs/get?run_id={mlflow_id}")["run"])


@pytest.mark.slow
def test_a_local_run_tells_its_mlflow_run_its_figures_and_resume_logs_into_it_again(
    project: Path, tmp_path: Path, no_user_trackers: None, mlflow_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """2 local nodes preempted once: the MLflow run `up` made holds mncloud's figures at each
    attempt's end (step = attempt), `status` and the run's web page link it; `up --resume`
    logs into the same MLflow run, no new one."""
    from mncloud.operate import run_status
    from mncloud.records.store import load_current
    from tests.test_local import cli, up, wait_final, wait_until

    monkeypatch.setenv(mlflowrun.TIMEOUT_ENV, "120")
    script = project / "waits.py"
    script.write_text(PREEMPTED_ONCE)
    flags = ("--nodes", "2", "--gpus", "cpu:1", "--recovery-delay", "0.5s",
             "--env", f"MLFLOW_TRACKING_URI={mlflow_server}")  # fmt: skip
    up("fig", script, *flags, script_args=[str(tmp_path)])
    wait_until(lambda: (tmp_path / "started").exists(), 240, "the first attempt")
    cli("chaos", "preempt", "fig")
    state = wait_final("fig")
    assert (state.state.value, state.preemptions) == ("SUCCEEDED", 1)
    envs = load_current("fig").spec["envs"]
    mlflow_id, experiment = envs["MLFLOW_RUN_ID"], envs["MLFLOW_EXPERIMENT_ID"]
    link = f"{mlflow_server}/#/experiments/{experiment}/runs/{mlflow_id}"
    assert run_status("fig").trackers == {"MLflow": link}
    assert f"MLflow run: {link}" in " ".join(cli("status", "fig").output.split())

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    history = {k: [(m.step, m.value) for m in client.get_metric_history(mlflow_id, k)]
               for k in ("mncloud.preemptions", "mncloud.restarts")}  # fmt: skip
    # Attempt 1 ended by the preemption, attempt 2 by the finish.
    assert sorted(history["mncloud.preemptions"]) == [(1, 1.0), (2, 1.0)], history
    assert sorted(history["mncloud.restarts"]) == [(1, 0.0), (2, 1.0)], history
    tags = {t["key"]: t["value"] for t in _mlflow_run(mlflow_server, mlflow_id)["data"]["tags"]}
    assert (tags["mncloud.preemptions"], tags["mncloud.restarts"]) == ("1", "1"), tags
    assert float(tags["mncloud.cost_usd"]) >= 0

    from fastapi.testclient import TestClient

    from mncloud.ui.app import create_app

    page = TestClient(create_app()).get("/runs/fig")
    assert f'<a href="{link}" rel="noopener noreferrer">MLflow run</a>' in page.text

    up("fig", script, *flags, "--resume", script_args=[str(tmp_path)])
    assert wait_final("fig").state.value == "SUCCEEDED"
    again = load_current("fig")
    assert again.spec["envs"]["MLFLOW_RUN_ID"] == mlflow_id
    found = mlflowrun.call(mlflow_server, "runs/search", {"experiment_ids": [experiment]})
    assert [r["info"]["run_id"] for r in found["runs"]] == [mlflow_id]


class _Preempted(Exception):
    """Stands for the preemption that ends an attempt of the in-process Trainer runs."""


def _hf_attempt(folder: Path, stop_at: int | None, resume: Path | None) -> None:
    """One attempt of the Trainer example's model and data, logging to MLflow through the
    Trainer's own `MLflowCallback` (`report_to="mlflow"`) every step, a checkpoint every 4;
    `stop_at`: the attempt ends (preempted) once step `stop_at` logged."""
    import mlflow
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, set_seed
    from transformers import TrainingArguments as Args

    from mncloud.train.hf import MncloudCallback

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        import hf_trainer as example
    finally:
        sys.path.pop(0)

    class Preempt(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == stop_at:
                raise _Preempted

    args = Args(output_dir=str(folder), max_steps=16, save_steps=4, logging_steps=1, seed=0,
                data_seed=0, full_determinism=True, use_cpu=True, learning_rate=1e-3,
                per_device_train_batch_size=8, report_to=["mlflow"], disable_tqdm=True)  # fmt: skip
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2,
                                       n_head=2))  # fmt: skip
    data = example.Tokens(256, 32, 128)
    fit = Trainer(model=model, args=args, train_dataset=data,
                  callbacks=[Preempt(), MncloudCallback()])  # fmt: skip
    try:
        fit.train(resume_from_checkpoint=str(resume) if resume else None)
    except _Preempted:
        pass
    finally:
        mlflow.end_run()  # a preempted process's run is gone with it


def test_a_trainer_run_preempted_twice_logs_each_step_once_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: Path, no_user_trackers: None,
    mlflow_server: str, mlflow_hooked: Any,
) -> None:  # fmt: skip
    """The Trainer's `MLflowCallback` reads `MLFLOW_RUN_ID` itself: attempts that log past
    their last checkpoint (to step 7, saved at 4; to 11, saved at 8; to 16) all log into the
    run `up` made, each step once, with the uninterrupted run's values."""
    pytest.importorskip("transformers")
    from mncloud.train import mlflowhook

    monkeypatch.setenv(constants.MLFLOW_TRACKING_URI_ENV, mlflow_server)
    monkeypatch.setenv(mlflowrun.TIMEOUT_ENV, "120")
    ids = {}
    for name in ("straight", "run"):
        made = mlflowrun.with_mlflow_run(_spec(project), f"{RUN_ID}-{name}", pytest.fail)
        ids[name] = made.envs[constants.MLFLOW_RUN_ID_ENV]
    monkeypatch.setenv(constants.MLFLOW_RUN_ID_ENV, ids["straight"])
    mlflow_hooked()
    _hf_attempt(tmp_path / "straight", None, None)
    expected = _history(mlflow_server, ids["straight"], "loss")
    assert [s for s, _ in expected] == list(range(1, 17)), expected

    run = tmp_path / "run"
    for stop_at, resume in ((7, None), (11, 4), (None, 8)):
        monkeypatch.setenv(constants.MLFLOW_RUN_ID_ENV, ids["run"])  # mlflow.start_run took it
        mlflow_hooked()  # a relaunch: a new process
        _hf_attempt(run, stop_at, run / f"checkpoint-{resume}" if resume else None)
    got = _history(mlflow_server, ids["run"], "loss")
    assert [s for s, _ in got] == list(range(1, 17)), got
    assert [v for _, v in got] == pytest.approx([v for _, v in expected])
    tags = mlflowrun.call(mlflow_server, f"runs/get?run_id={ids['run']}")["run"]["data"]["tags"]
    assert {t["key"]: t["value"] for t in tags}[mlflowhook.RESUMED_TAG] == "4,8"


PL_ARGS = ["--epochs", "10", "--samples", "256", "--dropout", "0.5", "--compute-ms", "250",
           "--mlflow"]  # fmt: skip


def _mlflow_runs(uri: str, experiment: str) -> list[dict[str, Any]]:
    """The runs of experiment `experiment` (none when it does not exist)."""
    try:
        found = mlflowrun.experiment_id(uri, experiment)
    except mlflowrun.TrackerUnreachable:
        return []
    return list(mlflowrun.call(uri, "runs/search", {"experiment_ids": [found]}).get("runs", []))


def _preempted_twice(
    tmp_path_factory: pytest.TempPathFactory, s3_server: Any, mlflow_server: str, name: str,
    script: Path, args: list[str], ready: tuple[Any, Any],
) -> dict[str, list[tuple[int, float]]]:  # fmt: skip
    """`script` on 2 local nodes, `--ckpt-dir` in S3, MLflow at `mlflow_server`: preempted
    (node 1) when `ready[0](uri)` and again when `ready[1](uri)` hold, then the same run
    uninterrupted (`<name>-ref`). Each is checked to be one MLflow run (of its experiment,
    `<name>`); their `loss` histories."""
    from mncloud.records.store import load_current
    from tests.servers import use_s3
    from tests.test_local import cli, up, wait_final, wait_until
    from tests.test_trainers import FLAGS

    histories = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(tmp_path_factory.mktemp(f"{name}-home")))
        mp.setenv(mlflowrun.TIMEOUT_ENV, "120")
        use_s3(s3_server, mp)
        bucket = s3_server.make_bucket()
        for run, when in ((name, ready), (f"{name}-ref", ())):
            env = ["--env", f"MLFLOW_TRACKING_URI={mlflow_server}",
                   "--env", f"MLFLOW_EXPERIMENT_NAME={run}"]  # fmt: skip
            up(run, script, *FLAGS, *env, "--bucket", f"s3://{bucket}/exp", script_args=args)
            uri = f"s3://{bucket}/exp/{run}"
            for k, check in enumerate(when):
                wait_until(lambda c=check, u=uri: c(u), 400, f"{run}'s checkpoint {k + 1}")
                cli("chaos", "preempt", run, "--node", "1")
            state = wait_final(run, timeout=400)
            assert (state.state.value, state.preemptions) == ("SUCCEEDED", len(when))
            mlflow_id = load_current(run).spec["envs"][constants.MLFLOW_RUN_ID_ENV]
            assert [r["info"]["run_id"] for r in _mlflow_runs(mlflow_server, run)] == [mlflow_id]
            histories[run] = _history(mlflow_server, mlflow_id, "loss")
    return histories


@pytest.mark.slow
@pytest.mark.catalog
def test_a_lightning_run_on_2_nodes_preempted_twice_is_one_mlflow_run_each_step_once(
    tmp_path_factory: pytest.TempPathFactory, s3_server: Any, mlflow_server: str,
    no_user_trackers: None,
) -> None:  # fmt: skip
    """#59's acceptance: the Lightning example with an `MLFlowLogger` of its own, 2 local
    nodes, preempted after its step-8 and step-20 checkpoints: one MLflow run, whose `loss`
    history has every step once and equals the uninterrupted run's."""
    pytest.importorskip("lightning")
    from tests.test_trainers import PL_SCRIPT, _last_step

    def saved(step: int) -> Any:
        return lambda uri: (_last_step(uri) or 0) >= step

    got = _preempted_twice(tmp_path_factory, s3_server, mlflow_server, "plm", PL_SCRIPT,
                           PL_ARGS, (saved(8), saved(20)))  # fmt: skip
    assert _mlflow_runs(mlflow_server, "lightning_logs") == []  # no logger's run of its own
    steps = [s for s, _ in got["plm"]]
    assert steps == list(range(40)), steps  # 10 epochs of 4 steps, each once
    assert [s for s, _ in got["plm-ref"]] == steps
    assert [v for _, v in got["plm"]] == pytest.approx([v for _, v in got["plm-ref"]])


HF_ARGS = ["--max-steps", "60", "--save-steps", "10", "--save-total-limit", "0",
           "--compute-ms", "250", "--mlflow"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_a_trainer_run_on_2_nodes_preempted_twice_is_one_mlflow_run_each_step_once(
    tmp_path_factory: pytest.TempPathFactory, s3_server: Any, mlflow_server: str,
    no_user_trackers: None,
) -> None:  # fmt: skip
    """#59's acceptance: the Trainer example logging through the Trainer's `MLflowCallback`,
    2 local nodes, preempted after checkpoint-20 and checkpoint-40 were committed: one MLflow
    run, whose `loss` history has every step once and equals the uninterrupted run's."""
    pytest.importorskip("transformers")
    from tests.test_trainers import HF_SCRIPT, _committed

    got = _preempted_twice(tmp_path_factory, s3_server, mlflow_server, "hfm", HF_SCRIPT,
                           HF_ARGS, (_committed(20), _committed(40)))  # fmt: skip
    steps = [s for s, _ in got["hfm"]]
    assert steps == list(range(1, 61)), steps
    assert [s for s, _ in got["hfm-ref"]] == steps
    assert [v for _, v in got["hfm"]] == pytest.approx([v for _, v in got["hfm-ref"]])
