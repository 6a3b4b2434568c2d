"""Interval saves while an upload still runs: staged into a second slot (never skipped), a block
only when both slots are busy (counted and logged), the work a preemption can lose, and no
first-save stall. Against a deliberately slow bucket: a real directory bucket whose shard
uploads sleep."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="mncloud.train needs torch")

from mncloud.storage import LocalBucket  # noqa: E402
from mncloud.storage.checkpoints import COMPLETE, CheckpointStore  # noqa: E402
from mncloud.train import CheckpointManager  # noqa: E402

STEP_S = 0.05
INTERVAL = 4
SLACK = 3
"""Steps a commit may trail its upload: agreed at the next step boundary, then COMPLETE is
written on the commit thread (a loaded 2-core machine adds a step or two)."""


class SlowBucket(LocalBucket):
    """A directory bucket whose `.distcp` uploads take `delays` seconds (one per upload, the
    last one repeating), and which notes when each step's COMPLETE landed."""

    def __init__(self, root: Path, delays: list[float]) -> None:
        super().__init__(root, retry_seconds=5)
        self.delays = delays
        self.uploads = 0
        self.commits: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def put_file(self, key: str, path: str | Path) -> None:
        if key.endswith(".distcp"):
            with self._lock:
                delay = self.delays[min(self.uploads, len(self.delays) - 1)]
                self.uploads += 1
            time.sleep(delay)
        super().put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> None:
        super().put_bytes(key, data)
        if key.endswith("/" + COMPLETE):
            step = int(key.rsplit("/", 2)[-2].removeprefix("step_"))
            self.commits.append((time.monotonic(), step))


def _manager(tmp_path: Path, delays: list[float], **kw) -> tuple[CheckpointManager, SlowBucket]:
    bucket = SlowBucket(tmp_path / "bucket", delays)
    ckpt = CheckpointManager(
        f"file://{tmp_path / 'bucket'}/run", interval_steps=INTERVAL, keep=50, **kw
    )
    ckpt.store = CheckpointStore(ckpt.uri, bucket=bucket, prefix="run")
    return ckpt, bucket


def _train(ckpt: CheckpointManager, steps: int) -> list[tuple[float, int]]:
    """Steps of STEP_S seconds that change the weights; returns (end time, step) per step."""
    model = torch.nn.Linear(256, 256)
    state = {"model": model, "step": 0}
    ckpt.load(state)
    times = []
    for step in range(1, steps + 1):
        time.sleep(STEP_S)
        with torch.no_grad():
            model.weight.fill_(step)
        state["step"] = step
        ckpt.maybe_save(step, state)
        times.append((time.monotonic(), step))
    ckpt.close()
    return times


def _max_lost_steps(times: list[tuple[float, int]], commits: list[tuple[float, int]]) -> int:
    """The most steps a preemption could have lost: at any moment, the step reached minus the
    newest committed step (0 before the first commit)."""
    worst = 0
    for t, step in times:
        newest = max((s for ct, s in commits if ct <= t), default=0)
        worst = max(worst, step - newest)
    return worst


def test_an_interval_during_a_slow_upload_is_staged_not_skipped(tmp_path: Path) -> None:
    """One upload takes 1.5 intervals: the next interval's snapshot waits in the second slot
    (no block), every interval is committed, and no moment risks more than one interval plus
    that upload (+SLACK)."""
    slow = 1.5 * INTERVAL * STEP_S
    ckpt, bucket = _manager(tmp_path, [0.0, slow, 0.0])
    times = _train(ckpt, 6 * INTERVAL)
    committed = sorted(s for _, s in bucket.commits)
    assert committed == list(range(INTERVAL, 6 * INTERVAL + 1, INTERVAL))
    assert ckpt.stats.saves == 6 and ckpt.stats.queued >= 1
    assert ckpt.stats.blocked == 0 and ckpt.stats.blocked_s == 0
    upload_steps = slow / STEP_S
    assert _max_lost_steps(times, bucket.commits) <= INTERVAL + upload_steps + SLACK
    # Each step's files hold that step's weights (the waiting snapshot was not overwritten).
    store = CheckpointStore(ckpt.uri)
    for step in (INTERVAL, 2 * INTERVAL, 3 * INTERVAL):
        target = {"model": torch.nn.Linear(256, 256), "step": -1}
        with CheckpointManager(ckpt.uri) as again:
            assert again.load(target, step=step) == step
        assert target["step"] == step and float(target["model"].weight[0, 0].detach()) == step
    assert store.latest()[0] == 6 * INTERVAL


def test_both_slots_busy_blocks_and_reports_it(tmp_path: Path, caplog) -> None:
    """Every upload takes 2.5 intervals: a third interval finds both slots busy and waits for
    the oldest commit; the waits are counted and logged, and still no interval is skipped."""
    slow = 2.5 * INTERVAL * STEP_S
    ckpt, bucket = _manager(tmp_path, [slow])
    with caplog.at_level(logging.WARNING):
        times = _train(ckpt, 4 * INTERVAL)
    assert sorted(s for _, s in bucket.commits) == [4, 8, 12, 16]
    assert ckpt.stats.blocked >= 1 and ckpt.stats.blocked_s > 0.1
    assert ckpt.stats.last_blocked_s > 0
    assert "waited" in caplog.text and "every staging slot was busy" in caplog.text
    assert "skipping" not in caplog.text
    # Blocking bounds it in steps: never three intervals' worth.
    assert _max_lost_steps(times, bucket.commits) <= 3 * INTERVAL + SLACK


def test_one_slot_blocks_at_the_next_interval(tmp_path: Path) -> None:
    ckpt, bucket = _manager(tmp_path, [2 * INTERVAL * STEP_S], staging_slots=1)
    _train(ckpt, 3 * INTERVAL)
    assert sorted(s for _, s in bucket.commits) == [4, 8, 12]
    assert ckpt.stats.blocked == 2 and ckpt.stats.queued == 0


def test_close_commits_a_final_step_staged_behind_a_slow_upload(tmp_path: Path) -> None:
    ckpt, bucket = _manager(tmp_path, [1.0, 0.0])
    state = {"model": torch.nn.Linear(64, 64), "step": 0}
    assert ckpt.maybe_save(INTERVAL, state)
    assert ckpt.maybe_save(2 * INTERVAL, state)  # staged behind the slow one, returns at once
    assert ckpt.stats.blocked == 0  # it waited for no slot (no clock read)
    ckpt.close()
    assert [s for _, s in bucket.commits] == [INTERVAL, 2 * INTERVAL]  # in step order


def test_the_first_save_finds_its_buffers_allocated(tmp_path: Path) -> None:
    """The buffers are allocated in the background from load on, for the whole state (Adam's
    moments included), so the first interval save stages into buffers that exist, as later
    ones do (the stall figures: bench/ckpt.py; no clock here)."""
    from mncloud.train.staging import count_tensors
    from mncloud.train.state import tensor_state

    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])  # 33 MB
    opt = torch.optim.Adam(model.parameters())
    state = {"model": model, "optimizer": opt}
    ckpt = CheckpointManager(f"file://{tmp_path / 'b'}", interval_steps=INTERVAL, keep=2)
    ckpt.load(state)
    ckpt._slots.wait_warm()
    whole = count_tensors(tensor_state(state))
    assert whole > 2 * len(list(model.parameters()))  # the moments too
    assert ckpt._slots.warmed_tensors == whole
    stalls = []
    for step in range(1, 3 * INTERVAL + 1):
        model(torch.randn(4, 1024)).sum().backward()
        opt.step()
        if ckpt.maybe_save(step, state):
            stalls.append(ckpt.last_stall_s)
            ckpt.wait()
        elif step == 1:
            ckpt._slots.wait_warm()  # a warm-up after the first step, if any, is over
            assert ckpt._slots.warmed_tensors == count_tensors(tensor_state(state)) == whole
    ckpt.close()
    assert len(stalls) == 3 and ckpt.stats.first_stall_s == stalls[0]
