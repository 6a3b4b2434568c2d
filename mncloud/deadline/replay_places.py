"""Replay a multi-place policy over K aligned spot traces, and the exact K-place optimum.

The tick model of `mncloud.deadline.replay`, with K places: in each tick the cluster is SPOT in one
place (allowed only while that place's trace offers ≥ N nodes), ON_DEMAND (home place, always
allowed) or NONE. Every launch (from NONE, a switch of market, or a move to another place)
spends `overhead_ticks` billed ticks without progress, and a spot launch in place p also pays
`Place.launch_cost` once (the checkpoint's egress). A spot cluster is preempted in the first
tick its place offers < N nodes.

Traces given together must share `gap_seconds`; traces of different lengths are cut to the
shortest (`align`), and the caller says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mncloud.deadline.places import Choice, PlacesJob, PlacesObservation, PlacesPolicy
from mncloud.deadline.policy import Mode, past_deadline
from mncloud.deadline.replay import Result
from mncloud.errors import SpecError
from mncloud.plan.traces import Trace


def align(traces: Sequence[Trace], names: Sequence[str]) -> tuple[int, int | None]:
    """(the common gap, the common length if the traces differ in length, else None).

    SpecError naming two traces whose gaps differ."""
    gaps = {t.gap for t in traces}
    if len(gaps) > 1:
        shown = ", ".join(f"{n} ({t.gap} s)" for n, t in zip(names, traces, strict=True))
        raise SpecError(
            f"traces given together must share gap_seconds: {shown}; replay them one at a time"
        )
    lengths = {len(t.data) for t in traces}
    return gaps.pop(), (min(lengths) if len(lengths) > 1 else None)


def availability(traces: Sequence[Trace], nodes: int, length: int | None = None) -> np.ndarray:
    """A (K, ticks) bool array: place k offers ≥ `nodes` spot nodes at each tick."""
    n = length or min(len(t.data) for t in traces)
    return np.stack([t.available(nodes)[:n] for t in traces])


@dataclass
class PlacesResult(Result):
    """One replayed window across places; `spot_hours_by_place` in the places' order."""

    spot_hours_by_place: list[float] | None = None
    spot_cost_by_place: list[float] | None = None
    moves: int = 0  #: spot launches in another place than the spot launch before
    launch_cost: float = 0.0  #: $ of egress paid on launches

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["spot_hours_by_place"] = [round(h, 4) for h in self.spot_hours_by_place or []]
        out["spot_cost_by_place"] = [round(c, 4) for c in self.spot_cost_by_place or []]
        out["moves"] = self.moves
        out["launch_cost"] = round(self.launch_cost, 4)
        return out


def replay_places(policy: PlacesPolicy, available: np.ndarray, start: int = 0) -> PlacesResult:
    """Run `policy` over K places' availability from tick `start` (see the module docstring)."""
    pj = policy.pjob
    job = pj.job
    d = job.deadline_ticks
    window = available[:, start : start + d]
    if window.shape[1] < d:
        raise SpecError("the traces end before the deadline")
    history = [tuple(bool(v) for v in col) for col in window.T]
    none_up = (False,) * pj.k
    spot_ticks = [0] * pj.k
    od_ticks = idle = 0
    mode, place, overhead, work, t = Mode.NONE, None, 0, 0, 0
    last_market: Mode | None = None
    last_place: int | None = None
    switches = preemptions = moves = 0
    launch_cost = 0.0
    while work < job.work_ticks:
        up = history[t] if t < d else none_up
        if mode is Mode.SPOT and place is not None and not up[place]:
            mode, place, overhead, preemptions = Mode.NONE, None, 0, preemptions + 1
        if past_deadline(job, t):
            choice = Choice(Mode.ON_DEMAND)
        else:
            obs = PlacesObservation(t, work, mode, place, overhead, up, _Rows(history, t + 1))
            choice = policy.decide(obs)
        action, where = choice.mode, choice.place if choice.mode is Mode.SPOT else None
        if action is Mode.SPOT and (where is None or not up[where]):
            raise ValueError(f"policy {policy.name!r} chose spot at tick {t} in {where} without it")
        if action is not Mode.NONE and (action is not mode or where != place):
            overhead = job.overhead_ticks
            switches += last_market is not None and action is not last_market
            last_market = action
            if action is Mode.SPOT:
                moves += last_place is not None and where != last_place
                last_place = where
                launch_cost += pj.places[where].launch_cost  # type: ignore[index]
        if action is Mode.SPOT:
            spot_ticks[where] += 1  # type: ignore[index]
        elif action is Mode.ON_DEMAND:
            od_ticks += 1
        else:
            idle += 1
        if action is not Mode.NONE:
            if overhead:
                overhead -= 1
            else:
                work += 1
        mode, place, t = action, where, t + 1
    met = t <= d
    spot_cost = [n * pj.spot_tick_cost(p) for p, n in enumerate(spot_ticks)]
    return PlacesResult(
        policy=policy.name,
        start_hours=start * job.gap_seconds / 3600,
        cost=sum(spot_cost) + od_ticks * pj.on_demand_tick_cost() + launch_cost,
        on_demand_cost=job.on_demand_cost(),
        met_deadline=met,
        finished_hours=job.hours(t) if met else None,
        spot_hours=job.hours(sum(spot_ticks)),
        on_demand_hours=job.hours(od_ticks),
        idle_hours=job.hours(idle),
        switches=switches,
        preemptions=preemptions,
        spot_hours_by_place=[job.hours(n) for n in spot_ticks],
        spot_cost_by_place=spot_cost,
        moves=moves,
        launch_cost=launch_cost,
    )


class _Rows(Sequence[Sequence[bool]]):
    """The first `n` ticks of a window's per-place availability."""

    def __init__(self, rows: list[tuple[bool, ...]], n: int) -> None:
        self._rows, self._n = rows, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._rows[i] for i in range(*index.indices(self._n))]
        if not -self._n <= index < self._n:
            raise IndexError(index)
        return self._rows[index % self._n]


def optimum_places(pjob: PlacesJob, available: np.ndarray, starts: Sequence[int]) -> np.ndarray:
    """The least cost ($) to meet the deadline from each start across K places, knowing the
    whole traces: `replay.optimum`'s exact dynamic program with one spot state per place.

    Values at tick t per window and work done: `free` (nothing running), `od` and `spot[p]`
    (running, overhead paid). A move between places goes through `free` (a fresh launch).
    As in the single-place program, a launch is never left before its overhead is paid, nor
    made into a preemption that comes before it is paid (knowingly, neither is worth it).
    """
    job = pjob.job
    d, w_all, o, k = job.deadline_ticks, job.work_ticks, job.overhead_ticks, pjob.k
    if available.shape[1] < max(starts) + d:
        raise SpecError("the traces end before the deadline")
    avail = np.stack([available[:, s : s + d] for s in starts], axis=1).astype(bool)  # K,W,d
    n_win = len(starts)
    done = np.full((n_win, w_all + 1), np.inf)
    done[:, w_all] = 0.0
    zeros = np.zeros((k, n_win, 1), int)
    runs = np.concatenate([zeros, np.cumsum(avail, axis=2)], axis=2)
    ps = [pjob.spot_tick_cost(p) for p in range(k)]
    launch = [pjob.places[p].launch_cost for p in range(k)]
    po = pjob.on_demand_tick_cost()
    ring = o + 1
    spot_at = [[done] * ring for _ in range(k)]
    od_at: list[np.ndarray] = [done] * ring
    free = done
    for t in range(d - 1, -1, -1):
        nxt = (t + 1) % ring
        cont_od = np.full((n_win, w_all + 1), np.inf)
        cont_od[:, :-1] = po + od_at[nxt][:, 1:]
        cont_spot, enter_spot = [], []
        for p in range(k):
            cont = np.full((n_win, w_all + 1), np.inf)
            cont[:, :-1] = np.where(avail[p, :, t : t + 1], ps[p] + spot_at[p][nxt][:, 1:], np.inf)
            cont_spot.append(cont)
            if o == 0:
                enter_spot.append(launch[p] + cont)
            elif t + o <= d:
                whole = (runs[p, :, t + o] - runs[p, :, t] == o)[:, None]
                later = spot_at[p][(t + o) % ring]
                enter_spot.append(np.where(whole, launch[p] + o * ps[p] + later, np.inf))
            else:
                enter_spot.append(done)
        if o == 0:
            enter_od = cont_od
        elif t + o <= d:
            enter_od = o * po + od_at[(t + o) % ring]
        else:
            enter_od = done
        free = np.minimum(free, enter_od)
        for p in range(k):
            free = np.minimum(free, enter_spot[p])
        free[:, w_all] = 0.0
        for p in range(k):
            spot_at[p][t % ring] = np.minimum(free, cont_spot[p])
        od_at[t % ring] = np.minimum(free, cont_od)
    return free[:, 0].copy()
