"""A deadline run's progress as the controller measures it: the newest complete checkpoint step
in the bucket, and the ranks' step times from the newest launches' telemetry."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from mncloud import layout
from mncloud.errors import MncloudError

if TYPE_CHECKING:
    from mncloud.control.state import ControlState

#: How long the checkpoint store is retried when the controller reads the newest step.
CKPT_LOOKUP_S = 5.0


def checkpoint_step(st: ControlState) -> int | None:
    """The newest complete checkpoint step (kept in `st.ckpt_step`); the last one known when
    the bucket cannot be read this tick (an old step being purged)."""
    from mncloud.storage import CheckpointStore

    if not st.ckpt_uri:
        return None
    try:
        good, _skipped = CheckpointStore(st.ckpt_uri, retry_seconds=CKPT_LOOKUP_S).candidates()
        step = good[0] if good else None
    except MncloudError:
        return st.ckpt_step
    st.ckpt_step = step if step is not None else st.ckpt_step
    return st.ckpt_step


def seconds_per_step(st: ControlState) -> float | None:
    """Wall seconds a step: a paced rehearsal's, what `--pace-steps` makes it (`pacing.py`);
    else the median of the ranks' newest step times, from the newest launch that has them."""
    from mncloud.telemetry.steps import read_steps

    if st.config.pace_step_s is not None:
        return st.config.pace_step_s / st.config.time_scale
    if not st.ckpt_uri:
        return None
    for run_id in reversed(st.run_ids[-3:]):
        try:
            ranks = read_steps(layout.series_uri(st.ckpt_uri, run_id))
        except Exception:  # the bucket may be unreachable for a tick
            continue
        times = [r.seconds_per_step for r in ranks.values() if r.seconds_per_step > 0]
        if times:
            return statistics.median(times)
    return None
