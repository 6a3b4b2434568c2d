"""Step times and stragglers, read off the run's telemetry segments (`telemetry.series`).

Torch-free and light (the standard library and `mncloud.layout`; the bucket code is imported
on the first read). Ranks publish nothing of their own for this: every step they report is in
their segments, and `from_series` cuts each rank's newest launch into windows of `WINDOW`
step gaps, as (mean seconds per step, steps timed), the last `SUSTAINED_WINDOWS` kept; each
rank's rollup keeps the same windows as its steps come (`telemetry.rollup`), so `status`
reads them without reading every step.

A straggler is a *sustained* slowdown, never one window: a rank is compared only once its last
`SUSTAINED_WINDOWS` windows each timed at least `MIN_SAMPLES` steps, and then with the fastest
of them (it was at least that slow throughout). It is flagged when that is at least
`STRAGGLER_FACTOR` × the median of the ranks compared. Why, by example (a healthy 2×2 CPU
demo):

    rank 3's only window timed 3 steps, warm-up included: 2.6× median → too few samples
    next windows: 1.0×, 1.1× median                                     → fastest 1.0×: calm
    a rank slowed by a bad host: 1.8×, 1.9×, 1.8× over 3 full windows   → straggler (1.8×)
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mncloud import layout
from mncloud.telemetry.segments import SUSTAINED_WINDOWS, WINDOW

if TYPE_CHECKING:
    from mncloud.telemetry.series import Series, StepRow

log = logging.getLogger(__name__)

#: A rank at least this many times slower than the median step time is a straggler.
STRAGGLER_FACTOR = 1.5
#: Windows a rank must have been slow in, in a row, to be flagged: `SUSTAINED_WINDOWS` (3).
#: Steps a window must have timed to count (the first windows include warm-up).
MIN_SAMPLES = 10


@dataclass(frozen=True)
class RankSteps:
    """One rank's recent step-time windows (`from_series`)."""

    rank: int
    seconds_per_step: float
    step: int = 0
    windows: tuple[tuple[float, int], ...] = ()
    """Recent windows, oldest first: (mean seconds per step, steps timed)."""

    def sustained(
        self, windows: int = SUSTAINED_WINDOWS, min_samples: int = MIN_SAMPLES
    ) -> float | None:
        """The fastest of the last `windows` windows, or None while they are too few or thin."""
        recent = self.windows[-windows:]
        if len(recent) < windows or any(n < min_samples or t <= 0 for t, n in recent):
            return None
        return min(t for t, _ in recent)


def read_steps(series_uri: str) -> dict[int, RankSteps]:
    """Each rank's step-time windows under a series URI (`layout.series_uri`), by rank."""
    from mncloud.telemetry.series import read_summary

    return from_series(read_summary(series_uri, metrics=False))


def from_series(series: Series, window: int = WINDOW) -> dict[int, RankSteps]:
    """Each rank's step-time windows from its telemetry segments: its newest launch's steps
    cut into windows of `window` steps, the last `SUSTAINED_WINDOWS` kept; its newest seconds
    per step is the mean over its last `window` steps (as `mncloud.train.StepTimer` keeps it),
    never a last window of a step or two. A series read through rollups brings them cut."""
    if series.windows is not None:
        return {
            rank: RankSteps(rank, w.seconds_per_step, w.step, w.windows)
            for rank, w in series.windows.items()
        }
    rows: dict[int, list[StepRow]] = {}
    for row in series.steps:
        rows.setdefault(row.rank, []).append(row)
    found: dict[int, RankSteps] = {}
    for rank, mine in rows.items():
        newest = [r for r in mine if r.launch == mine[-1].launch]
        gaps = [(b.t - a.t, b.step - a.step) for a, b in itertools.pairwise(newest)]
        gaps = [(t, n) for t, n in gaps if n > 0 and t > 0]
        windows: list[tuple[float, int]] = []
        for i in range(0, len(gaps), window):
            chunk = gaps[i : i + window]
            steps = sum(n for _, n in chunk)
            windows.append((sum(t for t, _ in chunk) / steps, steps))
        if windows:
            recent = gaps[-window:]
            mean = sum(t for t, _ in recent) / sum(n for _, n in recent)
            found[rank] = RankSteps(
                rank, mean, newest[-1].step, tuple(windows[-SUSTAINED_WINDOWS:])
            )
    return found


class RecordedRun(Protocol):
    """What `step_times` reads of a run record (`records.model.RunRecord` has it)."""

    run_id: str
    step_times: dict[int, float]

    @property
    def ckpt_uri(self) -> str | None: ...


def step_times(record: RecordedRun, ckpt_uri: str | None = None) -> dict[int, float]:
    """Each rank's sustained seconds per step (`RankSteps.sustained`), or the stored ones.

    The ranks' segments are under the record's checkpoint URI or, for a run without
    `--bucket` (a local run's checkpoint folder), under `ckpt_uri` when given. Ranks without
    enough windows yet are left out, so they are neither shown nor compared.
    """
    ckpt = record.ckpt_uri or ckpt_uri
    if not ckpt:
        return dict(record.step_times)
    uri = layout.series_uri(ckpt, record.run_id)
    try:
        published = read_steps(uri)
    except Exception as err:
        log.warning("step times not read from %s: %s", uri, err)
        return dict(record.step_times)
    if not published:
        return dict(record.step_times)
    times = {rank: steps.sustained() for rank, steps in published.items()}
    return {rank: t for rank, t in sorted(times.items()) if t is not None}


def straggler_ranks(step_times: Mapping[int, float], factor: float = STRAGGLER_FACTOR) -> list[int]:
    """Ranks whose step time is at least `factor` × the median of all ranks, sorted."""
    values = [t for t in step_times.values() if t > 0]
    if len(values) < 2:
        return []
    median = statistics.median(values)
    return sorted(r for r, t in step_times.items() if t >= factor * median)


def straggler_note(step_times: Mapping[int, float], ranks: list[int]) -> str:
    """`straggler rank 3 (1.8× median)`, or "" without stragglers."""
    values = [t for t in step_times.values() if t > 0]
    if not ranks or not values:
        return ""
    median = statistics.median(values)
    parts = [f"rank {r} ({step_times[r] / median:.1f}× median)" for r in ranks]
    return ("straggler " if len(parts) == 1 else "stragglers ") + ", ".join(parts)
