"""Benchmark: how close to the offline optimum can a policy that sees only the past get?

A reference for `bench/deadline.py` (issue #13's goal: mean ≤ 1.05× the optimum, never worse
than greedy in any group). It replays a *model policy* that is given more than any run-time
policy can have: each trace's own statistics. Availability is modelled as alternating up and
down runs (spot for all N nodes or not) whose length law is estimated from the whole trace,
per age in ticks (the chance that a run `a` ticks old ends at the next tick, over the trace's
complete runs; one pooled rate from `--ages` ticks on). Given that law, the policy is the
exact best one in expectation: a dynamic program over (tick, work left, cluster state,
availability and its age), in the replay's tick model (`mncloud.deadline.replay`), solved once per
grid cell. It still decides from the past and present of its window only, so what it misses
against the optimum is the price of not knowing the future — for any policy that treats
availability as such alternating runs, however it learns their law.

Same grid as `bench/deadline.py` (N, work, deadline factors, a window every 24 h, 10 min
restarts, the same prices), on the traces whose ticks are ≥ 100 s: the 30–32 s preemption
traces make grids of 8,640 ticks × 2,880 ticks of work, minutes per cell. It prints the
model policy, ours (`adaptive`) and greedy against the optimum on the same windows, and the
groups where the model policy is worse than greedy.

    .venv/bin/python bench/deadline_bound.py [--workers 2] [--ages 32]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from deadline import TRACES, Case, cell_windows, scenarios  # noqa: E402

from mncloud.deadline.policy import Job, Mode, Observation, Policy, make_policy, safe  # noqa: E402
from mncloud.deadline.replay import optimum, replay  # noqa: E402

MIN_GAP_S = 100
WAIT, GO_ON_DEMAND, GO_SPOT, KEEP = 0, 1, 2, 3  #: table entries: what to do in a state
_BIG = 1e12


def run_hazards(available: np.ndarray, ages: int) -> tuple[np.ndarray, np.ndarray]:
    """(down, up): P(a run `a` ticks old ends at the next tick), a = 1 … ages; the last
    entry pools every age ≥ `ages`. From the trace's complete runs (not the first or last)."""
    changes = np.flatnonzero(np.diff(available.astype(np.int8))) + 1
    runs = np.split(available, changes)[1:-1]
    out = []
    for side in (False, True):
        lengths = np.array([len(r) for r in runs if bool(r[0]) is side] or [1])
        hazard = np.empty(ages + 1)
        for age in range(1, ages):
            at_risk = (lengths >= age).sum()
            hazard[age] = (lengths == age).sum() / at_risk if at_risk else 0.0
        exposure = np.clip(lengths - ages + 1, 0, None).sum()
        hazard[ages] = (lengths >= ages).sum() / exposure if exposure else 0.0
        out.append(np.clip(hazard, 1e-6, 1.0))
    return out[0], out[1]


class AgeChain:
    """The availability chain: state `side * ages + age - 1`; each tick a run ends (to the
    other side, age 1) with its hazard, or ages by one (capped). `chain @ V` is the expected
    value of V one tick later, row by row."""

    def __init__(self, down: np.ndarray, up: np.ndarray, ages: int) -> None:
        self.ages = ages
        states = np.arange(2 * ages)
        side, age = states // ages, states % ages + 1
        self.end = np.where(side == 1, up[age], down[age])[:, None]
        self.flip = (1 - side) * ages
        self.older = side * ages + np.minimum(age, ages - 1)
        self.up = side == 1

    def __matmul__(self, values: np.ndarray) -> np.ndarray:
        return self.end * values[self.flip] + (1 - self.end) * values[self.older]

    def state(self, up: bool, age: int) -> int:
        return int(up) * self.ages + min(age, self.ages) - 1


def _launches(job: Job, chain: AgeChain, nxt: dict, stages: dict) -> dict:
    """Values of being `k` overhead ticks from running (k = 1 … overhead), paying this tick:
    on-demand goes on for sure; spot is lost (to waiting) if availability ends."""
    ps, po = job.tick_cost(Mode.SPOT), job.tick_cost(Mode.ON_DEMAND)
    up = chain.up[:, None]
    out = {}
    for k in range(1, job.overhead_ticks + 1):
        od_next = nxt["od"] if k == 1 else stages[("od", k - 1)]
        spot_next = nxt["spot"] if k == 1 else stages[("spot", k - 1)]
        out[("od", k)] = po + chain @ od_next
        out[("spot", k)] = np.where(up, ps + chain @ np.where(up, spot_next, nxt["none"]), _BIG)
    return out


def solve(job: Job, chain: AgeChain) -> dict[str, np.ndarray]:
    """Decision tables [tick, availability state, work left] for a cluster that is waiting
    (`none`), on spot (`spot`) or on on-demand (`od`), minimising the expected cost."""
    if job.overhead_ticks < 1:
        raise ValueError("the model policy needs a restart overhead of at least one tick")
    ps, po = job.tick_cost(Mode.SPOT), job.tick_cost(Mode.ON_DEMAND)
    shape = (2 * chain.ages, job.work_ticks + 1)
    end = np.full(shape, _BIG)
    end[:, 0] = 0.0
    nxt = {"none": end, "spot": end, "od": end}
    stages = {(m, k): end for m in ("od", "spot") for k in range(1, job.overhead_ticks + 1)}
    tables = {m: np.zeros((job.deadline_ticks, *shape), np.int8) for m in nxt}
    up = chain.up[:, None]
    for t in range(job.deadline_ticks - 1, -1, -1):
        stages = _launches(job, chain, nxt, stages)
        wait = chain @ nxt["none"]
        go_od, go_spot = stages[("od", job.overhead_ticks)], stages[("spot", job.overhead_ticks)]
        keep_spot, keep_od = np.full(shape, _BIG), np.full(shape, _BIG)
        keep_spot[:, 1:] = np.where(
            up, ps + (chain @ np.where(up, nxt["spot"], nxt["none"])), _BIG
        )[:, :-1]
        keep_od[:, 1:] = po + (chain @ nxt["od"])[:, :-1]
        new = {}
        for mode, keep in (("none", None), ("spot", keep_spot), ("od", keep_od)):
            options = [wait, go_od, go_spot] + ([keep] if keep is not None else [])
            stack = np.stack(options)
            tables[mode][t] = stack.argmin(0)
            new[mode] = stack.min(0)
            new[mode][:, 0] = 0.0
        nxt = new
    return tables


class ModelPolicy(Policy):
    """Follows the tables of `solve`; the safety net (`policy.safe`) still holds."""

    name = "model"

    def __init__(self, job: Job, chain: AgeChain, tables: dict[str, np.ndarray]) -> None:
        super().__init__(job)
        self.chain, self.tables = chain, tables
        self._up, self._age, self._seen = False, 0, 0

    def decide(self, obs: Observation) -> Mode:
        for up in obs.history[self._seen :]:
            self._age = self._age + 1 if bool(up) is self._up and self._seen else 1
            self._up, self._seen = bool(up), self._seen + 1
        if obs.overhead_left and (obs.mode is Mode.ON_DEMAND or obs.spot_now):
            return obs.mode  # a launch under way is seen through
        key = {Mode.NONE: "none", Mode.SPOT: "spot", Mode.ON_DEMAND: "od"}[obs.mode]
        if obs.mode is Mode.SPOT and not obs.spot_now:
            key = "none"
        state = self.chain.state(self._up, self._age)
        choice = self.tables[key][obs.tick, state, self.job.work_ticks - obs.work_done]
        mode = {WAIT: Mode.NONE, GO_ON_DEMAND: Mode.ON_DEMAND, GO_SPOT: Mode.SPOT}.get(
            int(choice), obs.mode
        )
        if mode is Mode.SPOT and not obs.spot_now:
            mode = Mode.NONE
        return mode if safe(self.job, obs, mode) else Mode.ON_DEMAND


Row = tuple[tuple[str, int, float], str, float, bool]


def _cell(case: Case, ages: int) -> list[Row]:
    """Rows (group, policy, cost / optimum, met) for every window of one grid cell."""
    cell = cell_windows(case)
    if cell is None:
        return []
    trace, job, starts = cell
    path, n, _, factor, *_ = case
    available = trace.available(n)
    chain = AgeChain(*run_hazards(available, ages), ages)
    tables = solve(job, chain)
    group = (str(Path(path).relative_to(TRACES).with_suffix("")), n, factor)
    rows = []
    for start, best in zip(starts, optimum(job, available, starts), strict=True):
        policies = {
            "model": ModelPolicy(job, chain, tables),
            "adaptive": make_policy("adaptive", job),
            "greedy": make_policy("greedy", job),
        }
        for name, policy in policies.items():
            r = replay(policy, available, start)
            rows.append((group, name, r.cost / best, r.met_deadline))
    return rows


def _report(rows: list[Row]) -> None:
    by_policy: dict[str, list[Row]] = defaultdict(list)
    groups: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_policy[row[1]].append(row)
        groups[row[0]][row[1]].append(row[2])
    print(f"{'policy':10} {'cost/optimum':>13} {'worst':>7} {'missed':>7}")
    for name, mine in by_policy.items():
        ratios = [r[2] for r in mine]
        missed = sum(not r[3] for r in mine)
        print(f"{name:10} {statistics.fmean(ratios):13.4f} {max(ratios):7.2f} {missed:7}")
    for name in ("model", "adaptive"):
        worse = [
            g
            for g, by in groups.items()
            if statistics.fmean(by[name]) > statistics.fmean(by["greedy"]) + 1e-9
        ]
        print(
            f"{name}: worse than greedy in {len(worse)} of {len(groups)} groups"
            + "".join(f"\n  {g[0]} N={g[1]} {g[2]:g}x" for g in worse)
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ages", type=int, default=32, help="run ages (ticks) told apart")
    args = parser.parse_args()
    if not TRACES.is_dir():
        print(f"skipped: no traces at {TRACES}")
        return 0
    began = time.perf_counter()
    cases = scenarios(0, 600.0, min_gap_s=MIN_GAP_S)
    with multiprocessing.Pool(args.workers) as pool:
        cells = pool.imap_unordered(functools.partial(_cell, ages=args.ages), cases)
        rows = [row for part in cells for row in part]
    _report(rows)
    elapsed = time.perf_counter() - began
    print(f"{len(rows) // 3} windows (traces with ticks ≥ {MIN_GAP_S} s); {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
