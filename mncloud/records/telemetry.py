"""Step-time telemetry: ranks publish their recent step times; `status` names the stragglers.

Torch-free and light (the standard library and `mncloud.layout`; the bucket code is imported
on the first publication), so every training process can import it (`mncloud.train.steptime`).

Each rank writes `layout.steps_uri(ckpt, run_id)/rank-<r>.json` now and then (rate-limited):

    {"rank": 3, "step": 420, "seconds_per_step": 0.21, "samples": 50, "time": …,
     "windows": [[0.20, 50], [0.22, 50], [0.21, 50]]}

`windows` are the rank's last `SUSTAINED_WINDOWS` publications, oldest first, each as
(mean seconds per step, steps timed in it). A straggler is a *sustained* slowdown, never one
window: a rank is compared only once its last `SUSTAINED_WINDOWS` windows each timed at least
`MIN_SAMPLES` steps, and then with the fastest of them (it was at least that slow throughout).
It is flagged when that is at least `STRAGGLER_FACTOR` × the median of the ranks compared.
Why, by example (a healthy 2×2 CPU demo, one publication per rank so far):

    rank 3's only window timed 3 steps, warm-up included: 2.6× median → too few samples
    next windows: 1.0×, 1.1× median                                     → fastest 1.0×: calm
    a rank slowed by a bad host: 1.8×, 1.9×, 1.8× over 3 full windows   → straggler (1.8×)
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mncloud import constants, layout

if TYPE_CHECKING:
    from mncloud.records.series import Series, StepRow

log = logging.getLogger(__name__)

#: A rank at least this many times slower than the median step time is a straggler.
STRAGGLER_FACTOR = 1.5
#: Publications (windows) a rank must have been slow in, in a row, to be flagged.
SUSTAINED_WINDOWS = 3
#: Steps a window must have timed to count (the first windows include warm-up).
MIN_SAMPLES = 10
#: Reads of the published step times give up after this long.
BUCKET_RETRY_SECONDS = 5.0
#: Environment variable carrying the run id to every node (render adds it to the task envs).
RUN_ID_ENV = constants.RUN_ID_ENV

_last_publish: dict[tuple[str, int], float] = {}
_windows: dict[tuple[str, int], deque[tuple[float, int]]] = {}


@dataclass(frozen=True)
class RankSteps:
    """One rank's newest publication."""

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

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RankSteps:
        windows = tuple((float(t), int(n)) for t, n in data.get("windows") or [])  # type: ignore[attr-defined]
        return cls(
            rank=int(data["rank"]),  # type: ignore[call-overload]
            seconds_per_step=float(data["seconds_per_step"]),  # type: ignore[arg-type]
            step=int(data.get("step") or 0),  # type: ignore[call-overload]
            windows=windows,
        )


def publish_step_time(
    seconds_per_step: float,
    step: int,
    *,
    samples: int | None = None,
    rank: int | None = None,
    min_interval: float = 30.0,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Publish this rank's recent mean step time to the run's bucket (at most every 30 s).

    `samples` is how many steps the mean spans (a window without it never counts as sustained).
    Reads the checkpoint URL, run id and rank from the environment (`MNCLOUD_CKPT_URI`,
    `MNCLOUD_RUN_ID`, `RANK`); returns False (doing nothing) when one is missing, when called
    again too soon, or when the bucket fails: a report must never slow or break training.
    """
    env = os.environ if environ is None else environ
    ckpt, run_id = env.get(constants.CKPT_URI_ENV), env.get(RUN_ID_ENV)
    rank = int(env.get("RANK", "0")) if rank is None else rank
    if not ckpt or not run_id:
        return False
    uri = layout.steps_uri(ckpt, run_id)
    now = time.monotonic()
    if now - _last_publish.get((uri, rank), -1e18) < min_interval:
        return False
    _last_publish[(uri, rank)] = now
    windows = _windows.setdefault((uri, rank), deque(maxlen=SUSTAINED_WINDOWS))
    windows.append((seconds_per_step, samples or 0))
    body = {
        "rank": rank,
        "step": step,
        "seconds_per_step": seconds_per_step,
        "samples": samples,
        "time": time.time(),
        "windows": [list(w) for w in windows],
    }
    from mncloud.storage import join_key, open_bucket

    try:
        bucket, prefix = open_bucket(uri, retry_seconds=2.0)
        bucket.put_bytes(join_key(prefix, f"rank-{rank}.json"), json.dumps(body).encode())
    except Exception as err:
        log.debug("step time not published: %s", err)
        return False
    return True


def read_steps(uri: str) -> dict[int, RankSteps]:
    """Every rank's newest publication under a steps URI (`layout.steps_uri`), by rank; where
    no rank published one, the same read off the run's telemetry segments beside it
    (`records.series`, `from_series`)."""
    from mncloud.storage import open_bucket

    bucket, prefix = open_bucket(uri, retry_seconds=BUCKET_RETRY_SECONDS)
    found: dict[int, RankSteps] = {}
    for obj in bucket.list(f"{prefix}/" if prefix else ""):
        steps = RankSteps.from_json(json.loads(bucket.get_bytes(obj.key)))
        found[steps.rank] = steps
    if not found and uri.rstrip("/").endswith(f"/{layout.STEPS_DIR}"):
        from mncloud.records.series import read_series

        series_uri = f"{uri.rstrip('/')[: -len(layout.STEPS_DIR)]}{layout.SERIES_DIR}"
        found = from_series(read_series(series_uri))
    return found


def from_series(series: Series, window: int = 50) -> dict[int, RankSteps]:
    """Each rank's step-time windows from its telemetry segments: its newest launch's steps
    cut into windows of `window` steps, the last `SUSTAINED_WINDOWS` kept, as if published."""
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
            found[rank] = RankSteps(
                rank, windows[-1][0], newest[-1].step, tuple(windows[-SUSTAINED_WINDOWS:])
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

    Ranks publish under the record's checkpoint URI or, for a run without `--bucket` (a local
    run's checkpoint folder), under `ckpt_uri` when given. Ranks without enough windows yet
    are left out, so they are neither shown nor compared.
    """
    ckpt = record.ckpt_uri or ckpt_uri
    if not ckpt:
        return dict(record.step_times)
    uri = layout.steps_uri(ckpt, record.run_id)
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
