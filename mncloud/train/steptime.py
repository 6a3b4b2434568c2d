"""`mncloud.train.report(step, loss=…)`: this rank's steps, step time and metrics.

Call it once per training step on every rank (`CheckpointManager.maybe_save` already does,
without metrics; `Progress.event(step=…, loss=…)` does with them). Each call buffers one record
for the run's telemetry segments (`mncloud.records.series`: `mncloud metrics`, the web view's
curves, the goodput ledger), which the segment writer's own thread appends to the bucket. It
also keeps the mean seconds per step over the last `WINDOW` steps and, at most every
`PUBLISH_INTERVAL_S`, hands it with the number of steps it spans to
`mncloud.records.telemetry.publish_step_time`, which writes
`<bucket>/<name>/runs/<run-id>/steps/rank-<r>.json`; `status` compares the ranks. No
collectives, no torch: ranks never wait on each other, and the write runs on a daemon thread so
a slow bucket never stalls training. Outside a run (no `MNCLOUD_RUN_ID`) nothing is written.

Steps, not calls, are timed: a call for the step already reported is ignored (so `report` and
`maybe_save` may both run each step), a jump of k steps counts as k steps, and a step that goes
backwards (a resume) restarts the timing. Example on one rank:

    t=0.0  report(100)   first call: baseline only
    t=1.0  report(101)   1 interval of 1.0 s
    t=1.0  report(101)   same step again (maybe_save after report): ignored
    t=5.0  report(105)   4 steps in 4.0 s: mean stays 1.0 s/step
    t=9.0  report(10)    resumed from a checkpoint: baseline again
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Steps the moving mean spans.
WINDOW = 50
#: Intervals needed before the first publication (the first steps include warm-up).
MIN_STEPS = 3
#: Seconds between publications (one small object per rank in the bucket).
PUBLISH_INTERVAL_S = 30.0

#: `publish(mean seconds per step, step, steps the mean spans)`.
Publish = Callable[[float, int, int], object]


def _publish(seconds_per_step: float, step: int, samples: int) -> bool:
    from mncloud.records import telemetry

    # The timer rate-limits already; telemetry's own limit would race with its thread's start.
    return telemetry.publish_step_time(seconds_per_step, step, samples=samples, min_interval=0.0)


class StepTimer:
    """Mean seconds per step over the last `window` steps of one rank, published now and then."""

    def __init__(
        self,
        *,
        window: int = WINDOW,
        min_steps: int = MIN_STEPS,
        interval: float = PUBLISH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        publish: Publish = _publish,
        background: bool = True,
    ) -> None:
        self.window, self.min_steps, self.interval = window, min_steps, interval
        self.clock, self.publish, self.background = clock, publish, background
        self._samples: deque[tuple[float, int]] = deque()  # (seconds, steps) per interval
        self._steps = 0
        self._last: tuple[int, float] | None = None
        self._next_publish = -float("inf")
        self._thread: threading.Thread | None = None

    @property
    def mean(self) -> float | None:
        """Seconds per step over the window, or None before `min_steps` steps were timed."""
        if self._steps < self.min_steps:
            return None
        return sum(s for s, _ in self._samples) / self._steps

    def report(self, step: int) -> float | None:
        """Record that `step` was reached now; returns the current mean (see `mean`)."""
        now = self.clock()
        if self._last is not None and step == self._last[0]:
            return self.mean
        if self._last is None or step < self._last[0]:
            self._samples.clear()
            self._steps = 0
        else:
            steps = step - self._last[0]
            self._samples.append((now - self._last[1], steps))
            self._steps += steps
            while len(self._samples) > 1 and self._steps - self._samples[0][1] >= self.window:
                self._steps -= self._samples.popleft()[1]
        self._last = (step, now)
        mean = self.mean
        if mean is not None and now >= self._next_publish and not self._publishing():
            self._next_publish = now + self.interval
            if self.background:
                self._thread = threading.Thread(
                    target=self._send,
                    args=(mean, step, self._steps),
                    name="mncloud-steptime",
                    daemon=True,
                )
                self._thread.start()
            else:
                self._send(mean, step, self._steps)
        return mean

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a publication in flight (tests; training never needs to)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _publishing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _send(self, mean: float, step: int, samples: int) -> None:
        try:
            self.publish(mean, step, samples)
        except Exception as err:  # a report must never break training
            log.debug("step time not published: %s", err)


_timer = StepTimer()
_series: Any = None  # this rank's `records.series.SeriesWriter`, made on the first report
_warned: set[str] = set()


def _writer() -> Any:
    global _series
    if _series is None:
        from mncloud.records.series import writer_from_env

        _series = writer_from_env() or False
    return _series


def report(step: int, *, ckpt_s: float | None = None, **metrics: object) -> float | None:
    """Report that this rank reached `step`, with any finite scalar metrics (`loss=…`) and the
    seconds a save blocked it (`ckpt_s`); returns its mean seconds per step (or None).

    Cheap (a clock read and a list append) and never raises; see the module docstring. The
    step and its metrics go to the run's telemetry segments (`mncloud.records.series`),
    written off this thread; a metric that is not a finite number is dropped with one warning.
    """
    with contextlib.suppress(Exception):
        mean = _timer.report(step)
        writer = _writer()
        if writer:
            record: dict[str, Any] = {"k": "step", "t": time.time(), "step": step}
            if ckpt_s:
                record["ckpt_s"] = round(float(ckpt_s), 4)
            if metrics:
                record["m"] = _finite(metrics)
            writer.add(record)
        return mean
    return None


def _finite(metrics: dict[str, object]) -> dict[str, float]:
    from mncloud.records.series import finite_metrics

    kept, dropped = finite_metrics(metrics)
    for name in dropped:
        if name not in _warned:
            _warned.add(name)
            log.warning("metric %r dropped: not a finite number (reported %r)", name, metrics[name])
    return kept
