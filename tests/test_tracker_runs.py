"""#59 end to end: the Hugging Face Trainer example logging to W&B (offline) and TensorBoard on
2 local nodes under `--ckpt-dir` in S3, preempted twice. Every attempt's offline W&B run has
the run's id and each resumed one is rewound to the step it resumed from; TensorBoard's event
files, read back from the bucket with its `EventAccumulator`, give each step once, with the
values of a run that never stopped.

A preempted attempt is SIGKILLed (a spot VM vanishing): W&B's service writes an offline run's
`.wandb` file in 32 KiB blocks, so a killed attempt's file may hold nothing yet (online, the
rows reach the server as they are logged). What each attempt asked W&B for is in the log W&B
writes line by line beside it (`logs/debug.log`: the run's config, with the rewind's branch
point); the last attempt's `.wandb` file is read with W&B's own reader."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mncloud.render.trackers import TB_FOLDER
from mncloud.storage.folders import survey
from mncloud.storage.frameworkdirs import newest
from tests.reference import _without_sleep
from tests.test_trackers import OfflineRun, _offline_run, wandb_offline_runs
from tests.test_trainers import (
    FLAGS,
    HF_SCRIPT,
    PL_SCRIPT,
    _bucket_file,
    _bucket_keys,
    _last_step,
)

STEPS = 40
ARGS = ["--max-steps", str(STEPS), "--save-steps", "10", "--save-total-limit", "0",
        "--logging-steps", "1", "--report-to", "wandb,tensorboard",
        "--compute-ms", "250"]  # fmt: skip


def _offline(folder: Path) -> list[str]:
    """`--env` for W&B offline, its runs under `folder` (local nodes share this disk)."""
    return ["--env", "WANDB_MODE=offline", "--env", "WANDB_SILENT=true",
            "--env", f"WANDB_DIR={folder}"]  # fmt: skip


def _newest_committed(uri: str) -> int:
    """The step of the newest committed `checkpoint-N` in the run's bucket (0: none)."""
    found = newest([v.name for v in survey(uri) if v.committed])
    return found.step if found is not None else 0


def _starts(name: str) -> list[int]:
    """The step each attempt's Trainer started from (its `start` events, rank 0's)."""
    from tests.test_local import run_series

    return [int(e.data["resumed_from"]) for e in run_series(name).events if e.event == "start"]


def _copy_tb(uri: str, folder: Path) -> Path:
    """The run's `tensorboard/` folder, copied from the bucket into `folder`."""
    for key in _bucket_keys(uri):
        if key.startswith(f"{TB_FOLDER}/"):
            (folder / key).parent.mkdir(parents=True, exist_ok=True)
            (folder / key).write_bytes(_bucket_file(uri, key))
    return folder / TB_FOLDER


def _tb_losses(folder: Path, tag: str) -> list[tuple[int, float]]:
    """`tag`'s scalars as TensorBoard shows `folder` (its own reader, the purged events
    dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), purge_orphaned_data=True)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _attempts(folder: Path) -> list[tuple[str, int | None]]:
    """Each attempt's offline run under `folder`, in the order they started: its W&B run id
    (in its folder's name, `offline-run-<time>-<id>`) and the `_step` its rewind keeps the
    history to (the branch point in the config `wandb.init` logged), if any."""
    found = []
    for run in sorted(folder.glob("wandb/offline-run-*")):
        said = (run / "logs" / "debug.log").read_text().split("\nconfig: ", 1)[1]
        config = ast.literal_eval(said.split("\n", 1)[0])
        point = config.get("_wandb", {}).get("branch_point")
        found.append((run.name.split("-", 3)[3], point["step"] if point else None))
    return found


def _figures(folder: Path, ends: int) -> list[OfflineRun]:
    """mncloud's figures runs under `folder` (`records.wandbfigures`), once `ends` are whole:
    the supervisor writes the last one as the run ends."""
    from mncloud.records.wandbfigures import FIGURES_DIR
    from tests.test_local import wait_until

    def whole() -> list[OfflineRun]:
        try:
            runs = wandb_offline_runs(folder / FIGURES_DIR)
        except (AssertionError, OSError, ValueError):  # one still being written
            return []
        return runs if all("mncloud.cost_usd" in r.summary for r in runs) else []

    wait_until(lambda: len(whole()) >= ends, 120, f"{ends} figures runs")
    return whole()


def _last_run(folder: Path) -> OfflineRun:
    """The last attempt's offline run (it ended: its file whole), with W&B's own reader."""
    (path,) = sorted(folder.glob("wandb/offline-run-*"))[-1].glob("*.wandb")
    return _offline_run(path)[1]


def _preempt_when(name: str, uri: str, ready: Callable[[], bool]) -> None:
    from tests.test_local import cli, wait_until

    wait_until(ready, 400, f"{name} ready to be preempted")
    cli("chaos", "preempt", name, "--node", "1")


def _preempted_twice(
    tmp_path_factory: pytest.TempPathFactory, s3_server: Any, name: str, script: Path,
    args: list[str], newest: Callable[[str], int],
) -> dict[str, Any]:  # fmt: skip
    """`script` on 2 local nodes under `--ckpt-dir` in S3, W&B offline: preempted once its
    newest checkpoint (`newest(uri)`, a step) is past 0, and again once its relaunch saved one
    past the step it resumed from; an uninterrupted run of it beside the last attempt. The
    attempts' W&B runs and each run's `tensorboard/` folder, copied from the bucket."""
    from tests.servers import use_s3
    from tests.test_local import run_log, up, wait_final

    home, wandb_dir = tmp_path_factory.mktemp(f"{name}-home"), tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(home))
        use_s3(s3_server, mp)
        bucket = f"s3://{s3_server.make_bucket()}/exp"
        uri, ref = f"{bucket}/{name}", f"{name}-ref"
        up(name, script, *FLAGS, *_offline(wandb_dir), "--bucket", bucket, script_args=args)
        _preempt_when(name, uri, lambda: newest(uri) > 0)
        _preempt_when(name, uri, lambda: len(_starts(name)) == 2 and
                      newest(uri) > _starts(name)[1])  # fmt: skip
        up(ref, script, *FLAGS, *_offline(tmp_path_factory.mktemp("wandb-ref")),
           "--bucket", bucket, script_args=_without_sleep(args))  # fmt: skip
        state = wait_final(name, timeout=400)
        assert state.state.value == "SUCCEEDED", run_log(name)
        assert wait_final(ref, timeout=400).state.value == "SUCCEEDED", run_log(ref)
        # mncloud's figures: one per attempt's end (2 preemptions, the finish), if it logs to W&B
        figures = _figures(wandb_dir, 3) if (wandb_dir / "wandb").exists() else []
        from mncloud.records.ledger import cost_summary
        from mncloud.records.store import load_current

        return {
            "figures": figures, "cost": cost_summary(load_current(name)).total,
            "state": state, "starts": _starts(name), "attempts": _attempts(wandb_dir),
            "wandb": [_last_run(wandb_dir)] if (wandb_dir / "wandb").exists() else [],
            "tb": _copy_tb(uri, tmp_path_factory.mktemp("tb")),
            "straight_tb": _copy_tb(f"{bucket}/{ref}", tmp_path_factory.mktemp("tb-ref")),
        }  # fmt: skip


@pytest.fixture(scope="module")
def preempted_twice(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Trainer example, logging to W&B and TensorBoard every step, preempted twice."""
    pytest.importorskip("transformers")
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    return _preempted_twice(tmp_path_factory, s3_server, "trk-hf", HF_SCRIPT, ARGS,
                            _newest_committed)  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_every_attempt_logs_into_one_wandb_run_rewound_to_the_step_it_resumed_from(
    preempted_twice: dict[str, Any],
) -> None:
    run = preempted_twice
    assert (run["state"].preemptions, len(run["starts"])) == (2, 3), run["starts"]
    first, *resumed = run["starts"]
    assert first == 0 and all(step > 0 for step in resumed), run["starts"]
    attempts = run["attempts"]
    assert len({run_id for run_id, _ in attempts}) == 1, attempts
    assert attempts[0][0].startswith("trk-hf-"), attempts
    # W&B numbers its rows from 0: the rows of steps 1 … N are 0 … N−1, the next is N.
    assert [step for _, step in attempts] == [None, *(step - 1 for step in resumed)], attempts
    (last,) = run["wandb"]  # the attempt that ended: its `.wandb` file whole
    assert (last.run_id, last.rewound_to) == (attempts[0][0], resumed[-1] - 1), last
    rows = _loss_rows(last)
    assert [row["train/global_step"] for row in rows] == list(range(resumed[-1] + 1, STEPS + 1))
    assert [row["_step"] for row in rows] == list(range(resumed[-1], STEPS)), rows
    # mncloud's figures at each attempt's end, in the same W&B run: summary fields, no rows.
    figures = run["figures"]
    assert [(f.run_id, f.rows) for f in figures] == [(attempts[0][0], [])] * 3, figures
    said = [(f.summary["mncloud.preemptions"], f.summary["mncloud.restarts"]) for f in figures]
    assert said == [(1, 0), (2, 1), (2, 2)], said
    costs = [f.summary["mncloud.cost_usd"] for f in figures]
    assert costs == sorted(costs) and costs[-1] == round(run["cost"], 4), (costs, run["cost"])


def _loss_rows(run: OfflineRun) -> list[dict[str, Any]]:
    return [row for row in run.rows if "train/loss" in row]


@pytest.mark.slow
@pytest.mark.catalog
def test_tensorboard_from_the_bucket_shows_each_step_once_as_the_uninterrupted_run(
    preempted_twice: dict[str, Any],
) -> None:
    got = _tb_losses(preempted_twice["tb"], "train/loss")
    straight = _tb_losses(preempted_twice["straight_tb"], "train/loss")
    assert [step for step, _ in straight] == list(range(1, STEPS + 1)), straight
    assert [step for step, _ in got] == list(range(1, STEPS + 1)), got
    assert [value for _, value in got] == pytest.approx([value for _, value in straight])
    (last,) = preempted_twice["wandb"]
    logged = [row["train/loss"] for row in _loss_rows(last)]  # W&B got the same values
    assert logged == pytest.approx([value for _, value in straight][-len(logged) :])


# --------------------------------------------------------------------------- when a rewind is due

RESUMED = {"WANDB_RUN_ID": "run-1", "WANDB_RESUME": "allow",
           "MNCLOUD_RESUME_FROM": "/ckpt/checkpoint-40"}  # fmt: skip


@pytest.mark.parametrize(
    ("unit", "step"),
    [("/ckpt/checkpoint-40", 40), ("/ckpt/epoch=3-step=40.ckpt", 40), ("/ckpt/last.ckpt", None),
     ("", None)],
)  # fmt: skip
def test_the_resumed_step_is_the_one_in_the_units_name(unit: str, step: int | None) -> None:
    from mncloud.train.trackers import resumed_step

    assert resumed_step({"MNCLOUD_RESUME_FROM": unit} if unit else {}) == step


@pytest.mark.parametrize(
    ("change", "moment"),
    [({}, "run-1?_step=39"), ({"MNCLOUD_TRACKER_OFF": "1"}, None),
     ({"WANDB_RESUME": "must"}, None), ({"WANDB_RUN_ID": ""}, None),
     ({"MNCLOUD_RESUME_FROM": "/ckpt/last.ckpt"}, None),
     ({"MNCLOUD_RESUME_FROM": "/ckpt/checkpoint-0"}, None)],
)  # fmt: skip
def test_a_wandb_rewind_is_due_only_on_a_resumed_attempt_of_mncloud_s_run(
    change: dict[str, str], moment: str | None
) -> None:
    """`--tracker none`, a `WANDB_RESUME` of the user's own, no id, or no step: no rewind."""
    from mncloud.train.trackers import wandb_moment

    assert wandb_moment({**RESUMED, **change}) == moment


def test_the_rewind_counts_the_rows_the_hf_trainer_logged_up_to_the_step(tmp_path: Path) -> None:
    """W&B numbers rows, not steps: a Trainer logging every 10 steps with an evaluation at 20
    has logged 5 rows by step 40 (`log_history`), so the history keeps rows 0 … 4."""
    from mncloud.train.trackers import wandb_moment

    unit = tmp_path / "checkpoint-40"
    unit.mkdir()
    history = [{"step": 10}, {"step": 20}, {"step": 20, "eval_loss": 1.0}, {"step": 30},
               {"step": 40}]  # fmt: skip
    (unit / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert wandb_moment({**RESUMED, "MNCLOUD_RESUME_FROM": str(unit)}) == "run-1?_step=4"
    (unit / "trainer_state.json").write_text(json.dumps({"log_history": []}))
    assert wandb_moment({**RESUMED, "MNCLOUD_RESUME_FROM": str(unit)}) is None


def test_a_rewind_w_b_refuses_is_a_warning_and_the_run_resumes_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """W&B's settings made with `resume="allow"` before mncloud's wrap (a script that set W&B up
    first) refuse `resume_from`: one warning, and `wandb.init` resumes the run without it."""
    wandb = pytest.importorskip("wandb")
    from mncloud.train import trackers

    monkeypatch.setattr(wandb, "init", wandb.init)
    for key, value in {**RESUMED, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                       "WANDB_DIR": str(tmp_path)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    wandb.setup()  # W&B's settings read WANDB_RESUME=allow now
    try:
        trackers.rewind_wandb()
        run = wandb.init(project="p")
        assert run.id == "run-1"
        run.finish()
    finally:
        wandb.teardown()
    said = [r.getMessage() for r in caplog.records if "not rewound" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("mncloud: W&B's history not rewound to "
                                                 "run-1?_step=39: "), said  # fmt: skip


# --------------------------------------------------------------------------- Lightning, from S3

PL_ARGS = ["--epochs", "10", "--samples", "256", "--log-every-n-steps", "1", "--logger",
           "--compute-ms", "250"]  # fmt: skip


@pytest.fixture(scope="module")
def pl_preempted_twice(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Lightning example (4 steps an epoch, saved at each epoch's end), its default
    TensorBoard logger logging every step, preempted twice."""
    pytest.importorskip("lightning")
    pytest.importorskip("tensorboard")
    return _preempted_twice(tmp_path_factory, s3_server, "trk-pl", PL_SCRIPT, PL_ARGS,
                            lambda uri: _last_step(uri) or 0)  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_lightning_s_tensorboard_from_the_bucket_shows_each_step_once_after_two_preemptions(
    pl_preempted_twice: dict[str, Any],
) -> None:
    """Lightning logs optimizer step k + 1 at step k: 40 steps are 0 … 39, each once, with the
    values of the run that never stopped."""
    run = pl_preempted_twice
    assert (run["state"].preemptions, len(run["starts"])) == (2, 3), run["starts"]
    got = _tb_losses(run["tb"] / "trk-pl", "loss")
    straight = _tb_losses(run["straight_tb"] / "trk-pl-ref", "loss")
    assert [step for step, _ in straight] == list(range(40)), straight
    assert [step for step, _ in got] == list(range(40)), got
    assert [value for _, value in got] == pytest.approx([value for _, value in straight])
