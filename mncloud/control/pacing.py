"""A deadline run's run time, and a local rehearsal paced by its training (`--pace-steps`).

Run time is wall time × `time_scale` since tick 0 (`started_at`), less the wall time a paced
rehearsal held it (`ControlState.held_s`). Ticks, the deadline and the finish are read off it.

Paced (`ControlConfig.pace_step_s`: `--hours` of work is `--pace-steps` steps): run time never
runs ahead of the training. The replay model counts a tick of work for each tick a launch
trains past its restart overhead (`model_work_ticks`); a new tick begins only once the newest
complete checkpoint step × `pace_step_s` has done that much work, else the clock stays at the
tick's start (`ControlState.paused_at_s`) while the controller keeps watching the launch. So a
slow machine rehearses the decisions, and meets the deadline, the way the model does; a fast
one runs at `time_scale` with its work ahead. Example, `--pace-steps 600 --hours 0.15` (0.9 s
of run time a step: 66.7 steps a tick of 60 s), overhead 4 ticks, `--time-scale 12`:

    tick 4   the launch trains past its overhead: the model counts 1 tick of work
    tick 5   begins at 25 s of wall time; the newest checkpoint is step 40 (< 66.7 steps):
             the clock stays at 300 s of run time; at step 80 it goes on from there

The controller's own actions take no run time when paced (`off_the_clock`): the wall time of
a launch call, a stop's notice and teardown, a preemption's teardown is held, as the model's
restart overhead stands for them. Waiting, starting up and the overhead pass at `time_scale`.
Not paced (a cloud, a rehearsal without `--pace-steps`): run time is wall time × `time_scale`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from mncloud.backends.base import RunState
from mncloud.deadline.policy import Mode

if TYPE_CHECKING:
    from mncloud.backends.base import RunStatus
    from mncloud.control.markets import Clock
    from mncloud.control.state import ControlState

#: Wall seconds between looks at the backend inside a tick (finish, failure), at most.
MAX_POLL_S = 30.0


def pause_s(state: ControlState, now: float) -> float:
    """Wall seconds from a look to the controller's next: to the next tick, or sooner."""
    cfg = state.config
    tick_wall = cfg.gap_s / cfg.time_scale
    run_s = run_seconds(state, now)
    to_next = ((run_s // cfg.gap_s + 1) * cfg.gap_s - run_s) / cfg.time_scale
    return max(0.01, min(to_next, MAX_POLL_S, max(0.2, tick_wall / 5)))


def run_seconds(state: ControlState, now: float) -> float:
    """Run time since tick 0 at wall time `now` (see the module docstring)."""
    if state.paused_at_s is not None:
        return state.paused_at_s
    start = state.started_at if state.started_at is not None else now
    return max(0.0, (now - start - state.held_s) * state.config.time_scale)


def holds(
    state: ControlState, now: float, status: RunStatus | None, work_ticks: Callable[[], int]
) -> bool:
    """Paced: whether the tick that began waits for the training (the clock stays at its start);
    False, and the clock goes on from there, once the training did the model's work, or when
    nothing trains."""
    cfg = state.config
    training = status is not None and status.state is RunState.RUNNING
    if (
        cfg.pace_step_s is None
        or not training
        or state.mode is Mode.NONE
        or work_ticks() >= state.model_work_ticks
    ):
        _release(state, now)
        return False
    if state.paused_at_s is None:
        state.paused_at_s = float((state.last_tick + 1) * cfg.gap_s)
    return True


def _release(state: ControlState, now: float) -> None:
    """Run time goes on from where it was held."""
    if state.paused_at_s is None:
        return
    start = state.started_at if state.started_at is not None else now
    state.held_s = max(state.held_s, now - start - state.paused_at_s / state.config.time_scale)
    state.paused_at_s = None


@contextmanager
def off_the_clock(state: ControlState, clock: Clock) -> Iterator[None]:
    """Paced: the wall time of the block (a launch, a stop) passes no run time."""
    began = clock.time()
    try:
        yield
    finally:
        if state.config.pace_step_s is not None and state.paused_at_s is None:
            state.held_s += max(0.0, clock.time() - began)
