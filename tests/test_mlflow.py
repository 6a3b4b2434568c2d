"""#59, MLflow: the run `up` made, on a real `mlflow server` (sqlite, a local artifact root):
`up --resume` logging into it again, each step once however often a Trainer or Lightning run
was resumed (in process, and on 2 local nodes preempted twice), mncloud's figures at each
attempt's end, and the tracker runs' links in `status` and the web view."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytest

from mncloud import constants
from mncloud.records import mlflowrun
from mncloud.render.trackers import wandb_run_id
from tests.servers import free_port
from tests.test_trackers import (  # noqa: F401 (no_user_trackers: a fixture)
    RUN_ID,
    _ckpt_of,
    _lightning_attempt,
    _spec,
    no_user_trackers,
)

#: No tracker variable of the user's reaches these tests.
pytestmark = pytest.mark.usefixtures("no_user_trackers")


def test_up_resume_logs_into_the_earlier_mlflow_run_while_the_server_holds_it(
    project: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: Path,
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


def test_the_mlflow_link_names_the_run_and_never_a_credential(project: Path) -> None:
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


def test_a_wandb_link_only_when_its_entity_and_project_are_known(project: Path) -> None:
    from mncloud.records.trackers import tracker_links

    assert tracker_links(_record(_spec(project, env=["WANDB_PROJECT=p"]))) == {}
    spec = _spec(project, env=["WANDB_ENTITY=team", "WANDB_PROJECT=p"])
    assert tracker_links(_record(spec)) == {"W&B": f"https://wandb.ai/team/p/runs/{RUN_ID}"}
    from mncloud.spec import Recovery

    nodes = spec.updated(recovery=Recovery.NODE)
    group = wandb_run_id(RUN_ID, room=6)
    assert tracker_links(_record(nodes)) == {"W&B": f"https://wandb.ai/team/p/groups/{group}"}


def test_figures_a_server_does_not_take_are_one_warning(project: Path) -> None:
    from mncloud.records.trackers import post_figures

    uri = f"http://127.0.0.1:{free_port()}"
    spec = _spec(project, env=[f"MLFLOW_TRACKING_URI={uri}", "MLFLOW_RUN_ID=abc123"])
    (said,) = post_figures(_record(spec))
    assert said.startswith(f"warning: mncloud's figures not sent to MLflow ({uri}: "), said
    assert post_figures(_record(_spec(project))) == []  # no tracker run: nothing sent


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
    project: Path, tmp_path: Path, mlflow_server: str,
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: Path,
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


def test_on_a_cloud_mncloud_s_callbacks_wrap_mlflow_and_a_later_logger_joins_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No site hook on a cloud node: making mncloud's callback wraps MLflow's client (each
    step once) and a Lightning `MLFlowLogger` made after it gets the run `up` made."""
    pytest.importorskip("mlflow")
    pytest.importorskip("lightning")
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking._tracking_service import client

    from mncloud.train import mlflowhook
    from mncloud.train.hf import MncloudCallback as TrainerCallback
    from mncloud.train.pl import MncloudCallback as LightningCallback

    cls = client.TrackingServiceClient
    for target, name in ((cls, "log_batch"), (cls, "log_metric"), (MLFlowLogger, "__init__")):
        original = getattr(target, name)
        monkeypatch.setattr(target, name, getattr(original, "__wrapped__", original))
    monkeypatch.setattr(mlflowhook, "_process", {})
    monkeypatch.delenv(constants.MLFLOW_RUN_ID_ENV, raising=False)
    LightningCallback(), TrainerCallback()
    assert not getattr(cls.log_batch, "_mncloud", False)  # no MLflow run of mncloud's: as is
    monkeypatch.setenv(constants.MLFLOW_RUN_ID_ENV, "0123abcd")
    TrainerCallback()
    assert cls.log_batch._mncloud and cls.log_metric._mncloud
    LightningCallback()
    assert MLFlowLogger(tracking_uri="http://127.0.0.1:9")._run_id == "0123abcd"
    assert MLFlowLogger(tracking_uri="http://127.0.0.1:9", run_id="mine")._run_id == "mine"
