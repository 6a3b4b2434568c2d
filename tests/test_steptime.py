"""`mncloud.train.report(step)`: the per-rank step timer, on a fake clock (the steps themselves
go to the telemetry segments: tests/test_series.py, tests/test_seriestail.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="mncloud.train needs torch (pip install mncloud[train])")

from mncloud.train import steptime
from mncloud.train.steptime import StepTimer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timer(clock: Clock, **kw: object) -> StepTimer:
    return StepTimer(clock=clock, **kw)  # type: ignore[arg-type]


def test_the_docstring_sequence() -> None:
    clock = Clock()
    t = timer(clock, min_steps=1)
    assert t.report(100) is None  # baseline only
    clock.now = 1.0
    assert t.report(101) == 1.0
    assert t.report(101) == 1.0  # the same step again (maybe_save after report): ignored
    clock.now = 5.0
    assert t.report(105) == 1.0  # 4 steps in 4 s
    clock.now = 9.0
    assert t.report(10) is None  # resumed from a checkpoint: baseline again
    clock.now = 11.0
    assert t.report(11) == 2.0


def test_moving_mean_over_the_window() -> None:
    clock = Clock()
    t = timer(clock, window=4, min_steps=3)
    for step in range(3):  # 1 s per step
        clock.now = float(step)
        assert t.report(step) is None  # fewer than 3 steps timed
    clock.now = 3.0
    assert t.report(3) == 1.0
    for step in range(4, 8):  # 3 s per step: the window forgets the fast ones
        clock.now = 3.0 + 3 * (step - 3)
        t.report(step)
    assert t.mean == 3.0


def test_module_report_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(step: int) -> float:
        raise RuntimeError("bug")

    monkeypatch.setattr(steptime._timer, "report", boom)
    assert steptime.report(3) is None


def test_checkpoint_manager_reports_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripts get the straggler view for free: `maybe_save` reports each step."""
    import torch

    from mncloud.train import CheckpointManager

    clock = Clock()
    monkeypatch.setattr(steptime, "_timer", timer(clock, min_steps=2))
    state = {"model": torch.nn.Linear(2, 2), "step": 0}
    with CheckpointManager(f"file://{tmp_path / 'b'}", interval_steps=2, keep=2) as ckpt:
        for step in range(1, 5):
            clock.now = 0.25 * step
            ckpt.maybe_save(step, state)
    assert steptime._timer.mean == pytest.approx(0.25)
