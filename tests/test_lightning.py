"""Lightning through mncloud's callback (`mncloud.train.pl`): every rank's RNG states kept in
the checkpoint, so dropout resumes exactly; a Trainer whose world is not torchrun's refused at
the start, in one line, not retried. The 2-node run preempted once with dropout is
tests/test_trainers.py's `pl_run` (`PL_ARGS` has `--dropout`)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mncloud import constants

pytest.importorskip("lightning")

REPO = Path(__file__).resolve().parents[1]
PL_SCRIPT = REPO / "examples" / "lightning_train.py"
MISMATCH = (
    "Lightning's world is 1 node × 1 device = 1 process but torchrun started 2 (WORLD_SIZE): "
    'each node would train alone; pass L.Trainer(num_nodes=int(os.environ["SKYPILOT_NUM_NODES"]),'
    ' devices=int(os.environ["LOCAL_WORLD_SIZE"]))'
)


@pytest.fixture(scope="module")
def example() -> Any:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import lightning_train
    finally:
        sys.path.remove(str(REPO / "examples"))
    return lightning_train


def _fit(example: Any, folder: Path, epochs: int, **trainer: Any) -> tuple[Any, str]:
    """The example's model with dropout, `epochs` epochs from `folder`'s `last.ckpt` (if any),
    as the example seeds it, mncloud's callback passed as a cloud script passes it; the trainer
    and the sha256 of the final weights."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mncloud.train.pl import MncloudCallback

    L.seed_everything(0, workers=True)
    fit = L.Trainer(
        max_epochs=epochs, deterministic=True, default_root_dir=folder, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=folder, save_last=True), MncloudCallback()],
        **trainer,
    )  # fmt: skip
    model = example.Regressor(dropout=0.5)
    loader = example.DataLoader(example.data(128), batch_size=32, shuffle=True)
    fit.fit(model, loader, ckpt_path="last")
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode() + value.numpy().tobytes())
    return fit, digest.hexdigest()


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("mncloud:")]


# --------------------------------------------------------------------------- fast


def test_dropout_resumes_exactly_from_the_rng_states_the_checkpoint_keeps(
    example: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One process: 2 epochs straight, and 1 epoch then a resume to 2 (seeded again, the model
    built again, as a relaunch does) end on the same weights; the same resume from a checkpoint
    without the states (or of another world size) says so once and ends elsewhere: dropout's
    draws depend on them."""
    import torch

    from mncloud.train.pl import RNG_KEY

    _, straight = _fit(example, tmp_path / "straight", 2)
    _fit(example, tmp_path / "resumed", 1)
    saved = torch.load(tmp_path / "resumed" / "last.ckpt")  # weights_only, torch's default
    assert len(saved[RNG_KEY]) == 1 and set(saved[RNG_KEY][0]) >= {"python", "numpy", "torch"}
    with caplog.at_level(logging.WARNING):
        _, resumed = _fit(example, tmp_path / "resumed", 2)
    assert resumed == straight
    assert _warned(caplog) == []

    for states, why in ((None, "the checkpoint holds no RNG states"),
                        ([saved[RNG_KEY][0]] * 2, "of 2 ranks, this run has 1")):  # fmt: skip
        folder = tmp_path / f"without-{len(states or [])}"
        folder.mkdir()
        torch.save({**saved, RNG_KEY: states}, folder / "last.ckpt")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _, other = _fit(example, folder, 2)
        assert other != straight
        warned = _warned(caplog)
        assert len(warned) == 1 and why in warned[0] and "not restored" in warned[0], warned


def test_rng_states_saved_beside_other_cuda_devices_restore_the_rest() -> None:
    """Python's, NumPy's (its key kept as a list) and torch's states come back; CUDA's, of
    another device count than this machine's, are left alone."""
    import random

    import numpy as np
    import torch

    from mncloud.train.pl import every_ranks_rng_states, set_rng_states

    [state] = every_ranks_rng_states()  # no process group: this process's alone
    assert isinstance(state["numpy"][1], list)
    drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    other = [torch.zeros(16, dtype=torch.uint8)] * (torch.cuda.device_count() + 1)
    set_rng_states({**state, "torch.cuda": other})
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == drawn


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process as torchrun's rank 0 of 2 (one process on each of 2 nodes); the path of
    its refusal marker."""
    marker = tmp_path / "refused"
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2",
                       constants.REFUSED_MARKER_ENV: str(marker)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    return marker


def test_a_world_that_is_not_torchrun_s_is_refused_before_a_step(
    example: Any, tmp_path: Path, torchrun_env: Path
) -> None:
    """`num_nodes` left at 1 under torchrun's 2 processes: refused at `fit`'s setup with the
    one line, left in the node's refusal marker (the run fails, not retried); nothing trained.
    An evaluation on one device (Lightning's own advice under DDP) is not refused."""
    from mncloud.train.pl import WorldMismatch

    with pytest.raises(WorldMismatch) as refused:
        _fit(example, tmp_path / "ckpt", 1)
    assert str(refused.value) == MISMATCH
    assert refused.value.code == 2  # uncaught: the process ends with 2, torchrun's worker fails
    assert torchrun_env.read_text(encoding="utf-8") == MISMATCH + "\n"
    assert not (tmp_path / "ckpt").exists()  # no checkpoint: no step was taken

    torchrun_env.unlink()
    import lightning as L

    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    loader = example.DataLoader(example.data(64), batch_size=32)
    model = example.Regressor()
    model.validation_step = model.training_step  # type: ignore[method-assign]
    trainer.validate(model, loader)
    assert not torchrun_env.exists()


def test_the_world_line_names_what_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning as L

    from mncloud.train.pl import world_mismatch

    def line(world: str | None, **trainer: Any) -> str | None:
        if world is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", world)
        return world_mismatch(L.Trainer(accelerator="cpu", logger=False, **trainer))

    assert line(None) is None  # not under a launcher: nothing to compare with
    assert line("1") is None
    assert line("2", num_nodes=2) is None
    assert line("4", num_nodes=2, devices=2, strategy="ddp") is None
    said = line("2", num_nodes=4)
    assert said is not None and said.startswith(
        "Lightning's world is 4 nodes × 1 device = 4 processes but torchrun started 2 "
        "(WORLD_SIZE): they would not train as one; pass L.Trainer(num_nodes="
    ), said


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.catalog
def test_lightning_with_num_nodes_left_at_1_on_2_nodes_is_refused_at_the_start() -> None:
    """The example with `--nodes 1` (a Trainer's default) on 2 local nodes: `mncloud up` ends
    failed (exit 1) with the one line, at once, not retried (though `--max-restarts 2` would
    retry an error), and before any step."""
    from mncloud.layout import run_dir
    from tests.test_local import run_log, run_series, state_of

    name = "plworld"
    done = subprocess.run(
        [sys.executable, "-m", "mncloud", "up", str(PL_SCRIPT), "--cloud", "local", "--name",
         name, "--yes", "--nodes", "2", "--gpus", "cpu:1", "--recovery", "gang",
         "--max-restarts", "2", "--no-preflight", "--", "--nodes", "1", "--epochs", "1"],
        env={**os.environ, "COLUMNS": "400"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    last = said.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"{name}: failed: node [01]: {re.escape(MISMATCH)} \(refused: not retried\)", last
    ), said
    state = state_of(name)
    assert state.refused and (state.attempt, state.restarts, state.errors_retried) == (1, 0, 0)
    assert f"mncloud: refused (not retried): {MISMATCH}" in run_log(name)
    assert [e.event for e in run_series(name).events if e.event == "start"] == []
    assert run_dir(name).is_dir()
