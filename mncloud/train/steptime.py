"""`mncloud.train.report(step, loss=…)`: this rank's steps, step time, metrics and events.

Call it once per training step on every rank (`CheckpointManager.maybe_save` already does,
without metrics; `Progress.event(step=…, loss=…)` does with them). Each call buffers one record
for the run's telemetry segments (`mncloud.telemetry.series`), which the segment writer's own
thread appends to the bucket: `mncloud metrics`, the web view's curves, the goodput ledger,
`status`'s stragglers, the deadline controller and, on the local backend, the supervisor and
its figures all read them. `event(name, …)` records what is not a step (a launch's start, its
end, a replica's news); it is written at once. No collectives: ranks never wait on each other,
and a slow bucket never stalls training. Outside a run (no `MNCLOUD_RUN_ID`) nothing is written.

`report` returns the mean seconds per step over the last `WINDOW` steps (`StepTimer`). Steps,
not calls, are timed: a call for the step already reported is ignored (so `report` and
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
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Steps the moving mean spans.
WINDOW = 50
#: Intervals needed before the mean is known (the first steps include warm-up).
MIN_STEPS = 3


class StepTimer:
    """Mean seconds per step over the last `window` steps of one rank (module docstring).

    It publishes nothing of its own: the steps it times are in the run's telemetry segments,
    where `status` compares the ranks (`telemetry.steps.from_series`)."""

    def __init__(
        self,
        *,
        window: int = WINDOW,
        min_steps: int = MIN_STEPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window, self.min_steps, self.clock = window, min_steps, clock
        self._samples: deque[tuple[float, int]] = deque()  # (seconds, steps) per interval
        self._steps = 0
        self._last: tuple[int, float] | None = None

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
        return self.mean


_timer = StepTimer()
_series: Any = None  # this rank's `telemetry.series.SeriesWriter`, made on the first report
_warned: set[str] = set()


def _writer() -> Any:
    global _series
    if _series is None:
        from mncloud.telemetry.series import writer_from_env

        _series = writer_from_env() or False
    return _series


def report(step: int, *, ckpt_s: float | None = None, **metrics: object) -> float | None:
    """Report that this rank reached `step`, with any finite scalar metrics (`loss=…`) and the
    seconds a save blocked it (`ckpt_s`); returns its mean seconds per step (or None).

    Cheap (a clock read and a list append) and never raises; see the module docstring. The
    step and its metrics go to the run's telemetry segments (`mncloud.telemetry.series`),
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


def event(name: str, **fields: object) -> None:
    """Record an event of this rank (`start` with `resumed_from`, `done`, a replica's `join`)
    in the run's telemetry segments, written at once; never raises."""
    with contextlib.suppress(Exception):
        writer = _writer()
        if writer:
            writer.add({"k": "event", "t": time.time(), "event": name, **fields})


def _finite(metrics: dict[str, object]) -> dict[str, float]:
    from mncloud.telemetry.series import finite_metrics

    kept, dropped = finite_metrics(metrics)
    for name in dropped:
        if name not in _warned:
            _warned.add(name)
            log.warning("metric %r dropped: not a finite number (reported %r)", name, metrics[name])
    return kept
