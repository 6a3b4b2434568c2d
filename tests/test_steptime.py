"""`mncloud.train.report(step)`: the per-rank step timer, on a fake clock."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="mncloud.train needs torch (pip install mncloud[train])")

from mncloud import constants
from mncloud.records import telemetry
from mncloud.train import steptime
from mncloud.train.steptime import StepTimer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timer(clock: Clock, sent: list[tuple[float, int]], **kw: object) -> StepTimer:
    """A timer that records (mean, step) of each publication; samples go to `timer.samples`."""

    def publish(mean: float, step: int, samples: int) -> None:
        sent.append((mean, step))
        t.samples.append(samples)

    t = StepTimer(clock=clock, publish=publish, background=False, **kw)  # type: ignore[arg-type]
    t.samples = []  # type: ignore[attr-defined]
    return t


def test_the_docstring_sequence() -> None:
    clock, sent = Clock(), []
    t = timer(clock, sent, min_steps=1)
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


def test_moving_mean_over_the_window_and_rate_limited_publication() -> None:
    clock, sent = Clock(), []
    t = timer(clock, sent, window=4, min_steps=3, interval=30.0)
    for step in range(4):  # 1 s per step
        clock.now = float(step)
        t.report(step)
    assert sent == [(1.0, 3)]  # published once 3 steps were timed
    assert t.samples == [3]  # type: ignore[attr-defined]
    for step in range(4, 8):  # then 3 s per step: the window forgets the fast ones
        clock.now += 3.0
        t.report(step)
    assert t.mean == 3.0
    assert sent == [(1.0, 3)]  # 15 s later: not yet
    clock.now += 20.0  # 35 s after the first publication; this step took 20 s
    t.report(8)
    assert sent[-1] == (pytest.approx((3 * 3 + 20) / 4), 8)
    assert t.samples[-1] == 4  # the window's steps  # type: ignore[attr-defined]


def test_publish_failures_never_reach_training() -> None:
    clock = Clock()

    def broken(mean: float, step: int, samples: int) -> None:
        raise OSError("bucket down")

    t = StepTimer(clock=clock, publish=broken, background=False, min_steps=1)
    t.report(1)
    clock.now = 1.0
    assert t.report(2) == 1.0


def test_background_publication_reaches_the_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default publisher: `telemetry.publish_step_time` on a daemon thread, into a file://
    bucket, with the number of steps its mean spans."""
    monkeypatch.setattr(telemetry, "_last_publish", {})
    monkeypatch.setattr(telemetry, "_windows", {})
    uri = f"file://{tmp_path}/exp"
    monkeypatch.setenv("MNCLOUD_CKPT_URI", uri)
    monkeypatch.setenv(constants.RUN_ID_ENV, "exp-20250101T000000-abcdef")
    monkeypatch.setenv("RANK", "5")
    clock = Clock()
    t = StepTimer(clock=clock, min_steps=2)
    for step in range(3):
        clock.now = 0.5 * step
        t.report(step)
    assert t._thread is not None and t._thread is not threading.current_thread()
    t.wait(10)
    path = tmp_path / "exp" / "runs" / "exp-20250101T000000-abcdef" / "steps" / "rank-5.json"
    data = json.loads(path.read_text())
    assert (data["rank"], data["step"], data["seconds_per_step"]) == (5, 2, 0.5)
    assert (data["samples"], data["windows"]) == (2, [[0.5, 2]])


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

    clock, sent = Clock(), []
    monkeypatch.setattr(steptime, "_timer", timer(clock, sent, min_steps=2))
    state = {"model": torch.nn.Linear(2, 2), "step": 0}
    with CheckpointManager(f"file://{tmp_path / 'b'}", interval_steps=2, keep=2) as ckpt:
        for step in range(1, 5):
            clock.now = 0.25 * step
            ckpt.maybe_save(step, state)
    assert steptime._timer.mean == pytest.approx(0.25)
    assert sent == [(pytest.approx(0.25), 3)]
