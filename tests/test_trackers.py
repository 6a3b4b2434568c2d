"""#59: one tracker run per training run. The variables every node gets (W&B's run id and
resume, its group under node recovery, the TensorBoard folder in `--ckpt-dir`), the MLflow run
`up` creates on a real `mlflow server` (sqlite, a local artifact root), a server that does not
answer, and `--tracker none`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

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
    constants.MLFLOW_RUN_ID_ENV, constants.TB_DIR_ENV, constants.TB_LOGGING_DIR_ENV,
    constants.TRACKER_OFF_ENV,
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
    from mncloud.spec import Tracker
    from mncloud.storage.folders import is_log

    spec = _spec(project, ckpt_dir="/ckpt/out", bucket=(tmp_path / "b").as_uri())
    env = task_env(spec, spot=False, run_id=RUN_ID)
    assert env[constants.TB_DIR_ENV] == tb_dir("/ckpt/out") == "/ckpt/out/tensorboard"
    assert is_log(Path(env[constants.TB_DIR_ENV]).name)  # synced file by file, restored
    assert env[constants.TB_LOGGING_DIR_ENV] == env[constants.TB_DIR_ENV]  # the HF Trainer's
    off = task_env(spec.updated(tracker=Tracker.NONE), spot=False, run_id=RUN_ID)
    assert not ({constants.TB_DIR_ENV, constants.TB_LOGGING_DIR_ENV} & set(off)), off


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


def _packages_but(package: str, folder: Path) -> Path:
    """A folder holding this Python's installed packages but `package` (links to each), for
    a node whose Python lacks it."""
    import site

    folder.mkdir()
    for root in map(Path, site.getsitepackages()):
        for entry in root.iterdir():
            name = entry.name.lower().replace("-", "_")
            if not name.startswith(package) and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return folder


def _preflight(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m mncloud.doctor node` as a node of 1 (CPU) whose Python has this one's
    packages but mlflow (`-S`: its own site-packages not read), with `env`."""
    packages = tmp_path / "site"
    if not packages.exists():
        _packages_but("mlflow", packages)
    base = {k: v for k, v in os.environ.items() if k not in TRACKER_VARS}
    path = [str(Path(__file__).resolve().parents[1]), str(packages)]
    base.update({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1",
                 "PYTHONPATH": os.pathsep.join(path), **env})  # fmt: skip
    return subprocess.run(
        [sys.executable, "-S", "-m", "mncloud.doctor", "node", "--workdir", str(tmp_path)],
        env=base, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_tracker_package_missing_on_a_node_is_named_in_the_preflight(tmp_path: Path) -> None:
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
    folder: Path, max_steps: int, resume: Path | None, logger: Any = True, every: int = 1
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
        max_steps=max_steps, deterministic=True, default_root_dir=folder, log_every_n_steps=every,
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


class OfflineRun(NamedTuple):
    """One offline W&B run as its `.wandb` file holds it."""

    run_id: str
    rewound_to: int | None
    """The `_step` its rewind (`resume_from`) keeps the history up to, if it has one."""
    rows: list[dict[str, Any]]
    """Its history rows, each with its `_step`."""
    summary: dict[str, Any]


def _value(item: Any) -> tuple[str, Any]:
    return item.key or "/".join(item.nested_key), json.loads(item.value_json)


def _offline_run(path: Path) -> tuple[float, OfflineRun]:
    """The run in `path` (a `.wandb` file, read with W&B's own reader) and its start time."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(str(path))
    runs, rows, summary = [], [], {}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            runs.append(record.run)
        elif kind == "history":
            rows.append(dict(_value(item) for item in record.history.item))
        elif kind == "summary":
            summary.update(_value(item) for item in record.summary.update)
    assert runs, (path, path.stat().st_size)
    run = runs[0]
    point = run.branch_point if run.HasField("branch_point") else None
    if point is not None:
        assert (point.run, point.metric) == (run.run_id, "_step"), point
    rewound = int(point.value) if point is not None else None
    return run.start_time.ToNanoseconds(), OfflineRun(run.run_id, rewound, rows, summary)


def wandb_offline_runs(folder: Path) -> list[OfflineRun]:
    """Each offline run under `folder`, in the order they started."""
    found = [_offline_run(p) for p in folder.glob("wandb/offline-run-*/*.wandb")]
    return [run for _, run in sorted(found, key=lambda pair: pair[0])]


def rewound_history(runs: list[OfflineRun]) -> list[dict[str, Any]]:
    """The history W&B shows for `runs`, one run's attempts: each attempt's rewind drops the
    rows past its `_step` before its own rows follow."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        if run.rewound_to is not None:
            rows = [row for row in rows if row["_step"] <= run.rewound_to]
        rows += run.rows
    return rows


@pytest.mark.parametrize("every", [1, 3])
def test_every_attempt_of_a_lightning_run_logs_into_the_same_wandb_run_rewound(
    every: int,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: Path, no_user_trackers: None,
) -> None:  # fmt: skip
    """Lightning's `WandbLogger`, as a script makes it (it passes `resume="allow"`), offline:
    three attempts (to step 6; from the checkpoint of step 4 to 10; from that of step 8 to
    12), each an offline run with the run's W&B id (from `task_env`, what every node gets);
    the resumed ones rewound to the rows logged up to their step (the checkpoint holds how
    many: one per step, or one per 3 with `log_every_n_steps=3`), so the history holds each
    logged step once, as the uninterrupted run's."""
    pytest.importorskip("lightning")
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    env = task_env(_spec(project), spot=False, run_id=RUN_ID)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    original = wandb.init
    for max_steps, resume in ((6, None), (10, 4), (12, 8)):
        for key, value in env.items():  # each attempt a process of its own: what it starts with
            if key.startswith("WANDB_"):
                monkeypatch.setenv(key, value)
        monkeypatch.setattr(wandb, "init", original)  # mncloud's rewind wraps it
        ckpt = _ckpt_of(tmp_path, resume) if resume else None
        if ckpt is not None:  # as the restore sets it (the unit's name carries its step)
            monkeypatch.setenv(constants.RESUME_FROM_ENV, str(ckpt))
        _lightning_attempt(tmp_path, max_steps, ckpt, WandbLogger(save_dir=tmp_path), every)
        wandb.finish()
        wandb.teardown()  # as a process's end: its records written, W&B's settings dropped
    runs = wandb_offline_runs(tmp_path)
    assert [run.run_id for run in runs] == [RUN_ID] * 3, runs
    logged = list(range(every - 1, 12, every))  # Lightning logs step k + 1 at step k
    # Rows 0…R−1 are the R rows of the steps up to the checkpoint; each attempt goes on at R.
    kept = [sum(1 for s in logged if s < n) for n in (4, 8)]
    assert [run.rewound_to for run in runs] == [None, *(r - 1 for r in kept)], runs
    assert [run.rows[0]["_step"] for run in runs] == [0, *kept], runs
    history = rewound_history(runs)
    assert [row["trainer/global_step"] for row in history] == logged, history
    assert [row["_step"] for row in history] == list(range(len(logged))), history


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


PLAIN_SCRIPT = """\
import json, os, sys
import torch
torch.manual_seed(0)
w = torch.zeros(3)
for step in range(5):
    w -= 0.1 * (w - torch.ones(3))
    print("STEP", os.environ["RANK"], step, round(float(w.sum()), 6), flush=True)
imported = sorted({m.split(".")[0] for m in sys.modules} & {"wandb", "mlflow", "tensorboard"})
print("IMPORTED", os.environ["RANK"], json.dumps(imported), flush=True)
"""


@pytest.mark.slow
def test_a_script_with_no_tracker_runs_the_same_with_trackers_on_and_off(
    project: Path, no_user_trackers: None
) -> None:
    """A script that logs to no tracker: the same output by default as under `--tracker
    none`, no tracker package imported into it, and no tracker file beside it (no W&B
    folder, no MLflow runs, no figures run)."""
    from tests.test_local import run_log, up, wait_final

    script = project / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    said = {}
    for name, flags in (("plain-on", ()), ("plain-off", ("--tracker", "none"))):
        up(name, script, "--nodes", "2", "--gpus", "cpu:1", *flags)
        assert wait_final(name).state.value == "SUCCEEDED", run_log(name)
        said[name] = sorted(line.split("] ", 1)[-1] for line in run_log(name).splitlines()
                            if "STEP " in line or "IMPORTED " in line)  # fmt: skip
    assert said["plain-on"] == said["plain-off"] and len(said["plain-on"]) == 12, said
    assert all(line.endswith("[]") for line in said["plain-on"] if "IMPORTED" in line)
    left = {p.name for p in project.rglob("*")} & {"wandb", "mlruns", "mncloud-figures"}
    assert left == set(), left
