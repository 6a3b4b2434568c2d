"""A deadline policy over a real spot trace, and the offline optimum over the same model.

The model, exactly (issue #13). Time moves in ticks of the trace's `gap_seconds`. In each tick
the cluster is SPOT (allowed only while the trace offers ≥ N nodes at that tick), ON_DEMAND
(always allowed) or NONE. Entering SPOT or ON_DEMAND from any other state (the start, a switch,
a relaunch after a preemption) spends `ceil(overhead / gap)` ticks of overhead: billed, no
progress. Every other billed tick adds one tick of work. A SPOT cluster is preempted in the
first tick that offers < N nodes. A tick costs N × $/node-hour × gap hours. The job needs
`ceil(hours / gap)` ticks of work and meets its deadline if that work is done within
`floor(deadline / gap)` ticks of its start. A run that misses it finishes on on-demand after
the deadline, so its cost stays comparable (and `met_deadline` is false).

Trace files: `{"metadata": {"gap_seconds": 300}, "data": [0, 16, 11, …], "prices": […]?}`
(`../shared/traces/README.md`): `data[i]` is how many spot nodes tick `i` offers (or holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mncloud.deadline.policy import (
    GangWait,
    Job,
    Mode,
    Observation,
    Policy,
    past_deadline,
    smaller_world_breakeven,
    ticks_floor,
)
from mncloud.errors import SpecError
from mncloud.plan.traces import Trace


def window_starts(
    trace: Trace,
    job: Job,
    every_s: float | None,
    start_s: float = 0,
    length: int | None = None,
) -> list[int]:
    """Start ticks of the windows to replay: one at `start_s`, or one every `every_s`, within
    the trace's first `length` ticks (all of them by default: traces cut to a common span).

    A window needs `deadline_ticks` ticks of trace; SpecError when none fits.
    """
    n = len(trace.data) if length is None else length
    hours = n * trace.gap / 3600
    first = ticks_floor(start_s, trace.gap)
    if every_s is not None:
        step = ticks_floor(every_s, trace.gap)
        if every_s <= 0 or step < 1:
            raise SpecError(f"--every {every_s / 3600:g} h: it must be at least one tick")
        if step > n:
            raise SpecError(f"--every {every_s / 3600:g} h is longer than the trace ({hours:g} h)")
    if first + job.deadline_ticks > n:
        raise SpecError(
            f"a window from {start_s / 3600:g} h to the deadline "
            f"({job.hours(job.deadline_ticks):g} h later) does not fit in the trace "
            f"({hours:g} h)"
        )
    if every_s is None:
        return [first]
    return list(range(first, n - job.deadline_ticks + 1, step))


@dataclass
class Result:
    """One replayed window (the JSON `replay --json` prints)."""

    policy: str
    start_hours: float
    cost: float
    on_demand_cost: float
    met_deadline: bool
    finished_hours: float | None
    spot_hours: float
    on_demand_hours: float
    idle_hours: float
    switches: int
    preemptions: int

    def to_json(self) -> dict[str, Any]:
        r = round
        return {
            "policy": self.policy,
            "start_hours": r(self.start_hours, 4),
            "cost": r(self.cost, 4),
            "on_demand_cost": r(self.on_demand_cost, 4),
            "met_deadline": self.met_deadline,
            "finished_hours": None if self.finished_hours is None else r(self.finished_hours, 4),
            "spot_hours": r(self.spot_hours, 4),
            "on_demand_hours": r(self.on_demand_hours, 4),
            "idle_hours": r(self.idle_hours, 4),
            "switches": self.switches,
            "preemptions": self.preemptions,
        }


def replay(
    policy: Policy, available: np.ndarray, start: int = 0, *, min_nodes: int | None = None
) -> Result:
    """Run `policy` over the trace's availability from tick `start`, in the exact tick model.

    `switches` counts launches in another market than the launch before (spot ↔ on-demand,
    directly or after a wait); `preemptions` counts spot clusters the trace took away.
    `min_nodes` (`plan --deadline --min-nodes`): see `_Ride`.
    """
    job = policy.job
    window = available[start : start + job.deadline_ticks]
    if len(window) < job.deadline_ticks:
        raise SpecError("the trace ends before the deadline")
    history = [bool(v) for v in window]
    ticks = {Mode.SPOT: 0, Mode.ON_DEMAND: 0, Mode.NONE: 0}
    mode, overhead, work, t = Mode.NONE, 0, 0.0, 0
    last_market: Mode | None = None
    switches = preemptions = 0
    ride = _Ride(job, min_nodes)
    while work < job.work_ticks:
        spot = t < job.deadline_ticks and history[t]
        ride.look(spot)
        if mode is Mode.SPOT and not spot:
            mode, overhead, preemptions = Mode.NONE, 0, preemptions + 1
        if past_deadline(job, t):
            action = Mode.ON_DEMAND
        else:
            obs = Observation(t, int(work), mode, overhead, spot, _Prefix(history, t + 1))
            action = policy.decide(obs)
        if action is Mode.SPOT and not spot:
            raise ValueError(f"policy {policy.name!r} chose spot at tick {t} without capacity")
        if action is not mode and action is not Mode.NONE:
            overhead = job.overhead_ticks
            switches += last_market is not None and action is not last_market
            last_market = action
        if action is Mode.NONE and not spot and ride.rides():
            work += ride.tick()
        else:
            ride.stop()
            ticks[action] += 1
        if action is not Mode.NONE:
            if overhead:
                overhead -= 1
            else:
                work += 1
        mode, t = action, t + 1
    met = t <= job.deadline_ticks
    return Result(
        policy=policy.name,
        start_hours=start * job.gap_seconds / 3600,
        cost=sum(n * job.tick_cost(m) for m, n in ticks.items()) + ride.cost(),
        on_demand_cost=job.on_demand_cost(),
        met_deadline=met,
        finished_hours=job.hours(t) if met else None,
        spot_hours=job.hours(ticks[Mode.SPOT]) + ride.hours(),
        on_demand_hours=job.hours(ticks[Mode.ON_DEMAND]),
        idle_hours=job.hours(ticks[Mode.NONE]),
        switches=switches,
        preemptions=preemptions,
    )


class _Ride:
    """`--min-nodes k`: every tick without spot for the gang is taken to leave k spot nodes (a
    dip, not a gap: an upper bound on what riding it is worth), and a tick the policy waits
    trains on them instead when the controller's rule says it pays (`smaller_world_pays`: the
    shortfall expected to last longer than `smaller_world_breakeven`, from the mean of the
    shortfalls that ended before it, without end before the first ended). A ride starts with a
    launch (overhead ticks, no progress), then does k/N of a tick's work a tick, billed as k/N
    of a spot tick; the launch that grows back is the policy's own spot launch."""

    def __init__(self, job: Job, min_nodes: int | None) -> None:
        self.job, self.k = job, min_nodes if min_nodes is not None else job.nodes
        self.breakeven = smaller_world_breakeven(job, self.k)
        self.gang = GangWait()
        self.riding, self.overhead, self.gang_ticks = False, 0, 0.0

    def look(self, spot: bool) -> None:
        """Count the shortfalls of the gang's spot as the controller counts them."""
        self.gang.look(not spot)

    def rides(self) -> bool:
        """Whether a tick the policy waits through a shortfall trains on k nodes (a ride goes
        on until the shortfall ends or the policy launches)."""
        if self.riding or self.k >= self.job.nodes:
            return self.riding
        if self.gang.expected() > self.breakeven:
            self.riding, self.overhead = True, self.job.overhead_ticks
        return self.riding

    def tick(self) -> float:
        """One tick of the ride: the work it does (none during its launch)."""
        share = self.k / self.job.nodes
        self.gang_ticks += share
        if self.overhead:
            self.overhead -= 1
            return 0.0
        return share

    def stop(self) -> None:
        self.riding = False

    def hours(self) -> float:
        """The ride's spot hours, as the gang's (k/N of each tick on k nodes)."""
        return self.gang_ticks * self.job.gap_seconds / 3600

    def cost(self) -> float:
        return self.gang_ticks * self.job.tick_cost(Mode.SPOT)


class _Prefix(Sequence[bool]):
    """The first `n` ticks of a window's availability: the past and present, not the future."""

    def __init__(self, data: list[bool], n: int) -> None:
        self._data, self._n = data, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._data[i] for i in range(*index.indices(self._n))]
        if not -self._n <= index < self._n:
            raise IndexError(index)
        return self._data[index % self._n]


def optimum(job: Job, available: np.ndarray, starts: Sequence[int]) -> np.ndarray:
    """The least cost ($) to meet the deadline from each start, knowing the whole trace.

    An exact dynamic program over (tick, work done, mode, overhead left), backwards from the
    deadline, vectorised over work done and over the windows. Two moves of the tick model are
    never worth making knowingly, so they are left out without changing the optimum: leaving a
    launch before its overhead is paid, and launching spot into a preemption that comes before
    its overhead is paid (both pay and gain nothing that waiting would not). A launch therefore
    jumps `overhead_ticks` ahead. State values at tick t, per window and work done w:
    `free` (nothing running), `spot` / `od` (running, overhead paid).
    """
    d, w_all, o = job.deadline_ticks, job.work_ticks, job.overhead_ticks
    ps, po = job.tick_cost(Mode.SPOT), job.tick_cost(Mode.ON_DEMAND)
    avail = np.stack([available[s : s + d] for s in starts]).astype(bool)
    if avail.shape[1] < d:
        raise SpecError("the trace ends before the deadline")
    k = len(starts)
    done = np.full((k, w_all + 1), np.inf)
    done[:, w_all] = 0.0
    runs = np.concatenate([np.zeros((k, 1), int), np.cumsum(avail, axis=1)], axis=1)
    ring = o + 1  # spot/od values for ticks t+1 … t+o, by tick modulo ring
    spot_at: list[np.ndarray] = [done] * ring
    od_at: list[np.ndarray] = [done] * ring
    free = done
    for t in range(d - 1, -1, -1):
        nxt = (t + 1) % ring
        cont_spot = np.full((k, w_all + 1), np.inf)
        cont_spot[:, :-1] = np.where(avail[:, t : t + 1], ps + spot_at[nxt][:, 1:], np.inf)
        cont_od = np.full((k, w_all + 1), np.inf)
        cont_od[:, :-1] = po + od_at[nxt][:, 1:]
        if o == 0:
            enter_spot, enter_od = cont_spot, cont_od
        elif t + o <= d:
            later = (t + o) % ring
            whole = (runs[:, t + o] - runs[:, t] == o)[:, None]
            enter_spot = np.where(whole, o * ps + spot_at[later], np.inf)
            enter_od = o * po + od_at[later]
        else:
            enter_spot = enter_od = done
        free = np.minimum(np.minimum(free, enter_spot), enter_od)
        free[:, w_all] = 0.0
        spot_at[t % ring] = np.minimum(free, cont_spot)
        od_at[t % ring] = np.minimum(free, cont_od)
    return free[:, 0].copy()
