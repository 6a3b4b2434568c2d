"""#59: mncloud's figures in the run's W&B run at each attempt's end (`records.wandbfigures`),
written by W&B itself (offline) and read back with W&B's own reader. The end to end run (2
local nodes preempted twice) is in tests/test_tracker_runs.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mncloud.records.wandbfigures import FIGURES_DIR, TIMEOUT_ENV
from mncloud.render.trackers import wandb_run_id
from tests.servers import free_port
from tests.test_mlflow import _record
from tests.test_trackers import (  # noqa: F401 (no_user_trackers: a fixture)
    RUN_ID,
    _spec,
    no_user_trackers,
    wandb_offline_runs,
)

pytest.importorskip("wandb")
pytestmark = pytest.mark.usefixtures("no_user_trackers")
FIGURES = {"mncloud.cost_usd", "mncloud.restarts", "mncloud.preemptions"}

ATTEMPT = """\
import sys, wandb
run = wandb.init(id=sys.argv[1], mode="offline", dir=sys.argv[2], project="p")
for step in range(3):
    run.log({"loss": 1.0 / (step + 1)})
run.finish()
"""


def _attempt(folder: Path, run_id: str) -> None:
    """An attempt of the script: an offline W&B run of `run_id` under `folder`, 3 rows."""
    subprocess.run([sys.executable, "-c", ATTEMPT, run_id, str(folder)], check=True,
                   env={"WANDB_SILENT": "true", "PATH": "/usr/bin:/bin"})  # fmt: skip


def _offline(folder: Path, *more: str) -> list[str]:
    return ["WANDB_MODE=offline", f"WANDB_DIR={folder}", "WANDB_PROJECT=p", *more]


def test_an_attempts_end_writes_the_figures_into_the_runs_offline_w_and_b_run(
    project: Path, tmp_path: Path
) -> None:
    from mncloud.records.trackers import post_figures

    _attempt(tmp_path, wandb_run_id(RUN_ID))
    assert post_figures(_record(_spec(project, env=_offline(tmp_path)))) == []
    (figures,) = wandb_offline_runs(tmp_path / FIGURES_DIR)
    assert figures.run_id == wandb_run_id(RUN_ID) and figures.rows == [], figures
    assert set(figures.summary) >= FIGURES, figures.summary
    assert (figures.summary["mncloud.restarts"], figures.summary["mncloud.preemptions"]) == (0, 0)
    (attempt,) = wandb_offline_runs(tmp_path)  # the attempt's own run: as it wrote it
    assert [row["_step"] for row in attempt.rows] == [0, 1, 2]
    assert not FIGURES & set(attempt.summary), attempt.summary


def test_under_node_recovery_each_nodes_run_that_logged_gets_them(
    project: Path, tmp_path: Path
) -> None:
    from mncloud.records.trackers import post_figures
    from mncloud.spec import Recovery

    group = wandb_run_id(RUN_ID, room=6)
    _attempt(tmp_path, f"{group}-n1")  # node 0 logged nothing (yet)
    spec = _spec(project, env=_offline(tmp_path), nodes=2).updated(recovery=Recovery.NODE)
    assert post_figures(_record(spec)) == []
    assert [r.run_id for r in wandb_offline_runs(tmp_path / FIGURES_DIR)] == [f"{group}-n1"]


@pytest.mark.parametrize(
    "change",
    [{}, {"env": ["WANDB_MODE=offline", "WANDB_PROJECT=p"]}, {"tracker": "none"}],
    ids=["no-wandb", "no-run-logged", "tracker-none"],
)
def test_a_run_without_a_wandb_run_gets_nothing(
    change: dict[str, Any], project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mncloud.records.trackers import post_figures

    if change.get("tracker"):
        _attempt(tmp_path, wandb_run_id(RUN_ID))
        change = {**change, "env": _offline(tmp_path)}
    monkeypatch.chdir(tmp_path)
    assert post_figures(_record(_spec(project, **change))) == []
    assert not (tmp_path / FIGURES_DIR).exists() and not (project / FIGURES_DIR).exists()


def test_a_w_and_b_server_that_does_not_answer_is_one_warning_without_the_key(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online: W&B's API retries such a server for minutes; `status` waits the timeout at
    most, then one line, and the API key is in no part of it."""
    from mncloud.records.trackers import post_figures

    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv(TIMEOUT_ENV, "5")
    url = f"http://127.0.0.1:{free_port()}"
    spec = _spec(project, env=["WANDB_PROJECT=p", "WANDB_ENTITY=team", f"WANDB_BASE_URL={url}"])
    (said,) = post_figures(_record(spec))
    assert said.startswith("warning: mncloud's figures not sent to W&B (") and "\n" not in said
    assert key not in said
