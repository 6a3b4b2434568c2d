"""Benchmark: every deadline policy over real spot traces, against on-demand and the optimum.

Replays every trace under ../shared/traces (beside the repository) over a grid: N nodes in
1/4/8/16 as the trace offers them, work 12/18/24 h, deadline 1.5/2/2.5/3 × the work, a window
starting every 24 h that fits in the trace, restart overhead 10 min, p3.2xlarge prices
(spot $0.918, on-demand $3.06 per node-hour). For each window it computes the offline optimum
(`deadline.replay.optimum`, an exact dynamic program over the same tick model) and replays each
policy (`mncloud.deadline.policy.POLICIES`). It prints, per scenario group (trace × N × deadline
factor), the mean cost relative to all on-demand and to the optimum, and deadlines missed; then
the totals and the checks: no deadline missed, ours never worse than greedy by more than 0.01
of the optimum in any group (issue #27's hedge), mean ≤ 1.05× the optimum.

    .venv/bin/python bench/deadline.py [--workers 2] [--max-windows K] [--overhead-min 10]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from mncloud.deadline.policy import DEFAULT_POLICY, POLICIES, Job, make_policy
from mncloud.deadline.replay import optimum, replay, window_starts
from mncloud.errors import SpecError
from mncloud.plan.traces import Trace, load_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
NODES = (1, 4, 8, 16)
WORK_HOURS = (12, 18, 24)
FACTORS = (1.5, 2.0, 2.5, 3.0)
EVERY_H = 24
SPOT, ON_DEMAND = 0.918, 3.06
GOAL = 1.05
GREEDY_MARGIN = 0.01  #: ours may be worse than greedy by at most this (of the optimum) per group

Case = tuple[str, int, float, float, float, int]  # trace, nodes, work h, factor, overhead s, max


def scenarios(max_windows: int, overhead_s: float, min_gap_s: int = 0) -> list[Case]:
    """The grid: every trace (with ticks of at least `min_gap_s`) × N × work × factor."""
    cases = []
    for path in sorted(TRACES.rglob("*.json")):
        trace = load_trace(path)
        if trace.gap < min_gap_s:
            continue
        for n in (n for n in NODES if n <= max(trace.data)):
            for work in WORK_HOURS:
                for factor in FACTORS:
                    cases.append((str(path), n, work, factor, overhead_s, max_windows))
    return cases


def cell_windows(case: Case) -> tuple[Trace, Job, list[int]] | None:
    """One grid cell's trace, job and window starts (one every 24 h); None if none fits."""
    path, n, work, factor, overhead_s, _ = case
    trace = load_trace(path)
    job = Job.build(
        nodes=n,
        hours=work,
        deadline_s=work * factor * 3600,
        overhead_s=overhead_s,
        gap_s=trace.gap,
        spot_price=SPOT,
        on_demand_price=ON_DEMAND,
    )
    try:
        return trace, job, window_starts(trace, job, EVERY_H * 3600)
    except SpecError:  # no window of this length fits in the trace
        return None


def _run(case: Case) -> list[tuple[str, int, float, str, float, float, bool]]:
    """Rows (group, n, factor, policy, cost/on-demand, cost/optimum, met) for one grid cell."""
    path, n, _, factor, _, max_windows = case
    cell = cell_windows(case)
    if cell is None:
        return []
    trace, job, starts = cell
    if max_windows and len(starts) > max_windows:  # evenly spaced sample
        starts = [starts[i * len(starts) // max_windows] for i in range(max_windows)]
    avail = trace.available(n)
    best = optimum(job, avail, starts)
    name = str(Path(path).relative_to(TRACES).with_suffix(""))
    rows = []
    for policy in POLICIES:
        for start, opt in zip(starts, best, strict=True):
            r = replay(make_policy(policy, job), avail, start)
            rows.append(
                (
                    name,
                    n,
                    factor,
                    policy,
                    r.cost / job.on_demand_cost(),
                    r.cost / opt,
                    r.met_deadline,
                )
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--max-windows",
        type=int,
        default=0,
        help="sample at most K evenly spaced windows per grid cell (0: all)",
    )
    parser.add_argument("--overhead-min", type=float, default=10.0)
    args = parser.parse_args()
    if not TRACES.is_dir():
        print(f"skipped: no traces at {TRACES}")
        return 0
    began = time.perf_counter()
    cases = scenarios(args.max_windows, args.overhead_min * 60)
    with multiprocessing.Pool(args.workers) as pool:
        rows = [row for part in pool.imap_unordered(_run, cases) for row in part]
    groups: dict[tuple[str, int, float], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for name, n, factor, policy, vs_od, vs_opt, met in rows:
        groups[(name, n, factor)][policy].append((vs_od, vs_opt, met))
    policies = list(POLICIES)
    print(_report(groups, policies))
    ok = _checks(groups, policies)
    windows = sum(len(v[DEFAULT_POLICY]) for v in groups.values())
    sampled = f", at most {args.max_windows} windows per cell" if args.max_windows else ""
    print(f"{windows} windows{sampled}; {time.perf_counter() - began:.0f} s")
    return 0 if ok else 1


def _report(groups: dict, policies: list[str]) -> str:
    short = {p: p[:8] for p in policies}
    head = f"{'group (trace, N, deadline/work)':44} {'win':>4} " + " ".join(
        f"{short[p]:>8}" for p in policies
    )
    head += f" {'opt/od':>7} {'ours/od':>7}"
    lines = [
        "cost / optimum per policy, then optimum and ours / all on-demand "
        "(means over windows); misses marked !",
        head,
    ]
    for (name, n, factor), by in sorted(groups.items()):
        cells = []
        for p in policies:
            misses = sum(not m for *_, m in by[p])
            cells.append(f"{statistics.fmean(x[1] for x in by[p]):7.3f}{'!' if misses else ' '}")
        ours = by[DEFAULT_POLICY]
        cells.append(f"{statistics.fmean(x[0] / x[1] for x in ours):7.3f}")
        cells.append(f"{statistics.fmean(x[0] for x in ours):7.3f}")
        label = f"{name[-34:]} N={n} {factor:g}x"
        lines.append(f"{label:44} {len(ours):4} " + " ".join(cells))
    lines.append("")
    lines.append(
        f"{'policy':18} {'cost/on-demand':>14} {'cost/optimum':>13} {'worst':>7} {'missed':>7}"
    )
    for p in policies:
        all_rows = [x for by in groups.values() for x in by[p]]
        lines.append(
            f"{p:18} {statistics.fmean(x[0] for x in all_rows):14.3f} "
            f"{statistics.fmean(x[1] for x in all_rows):13.3f} "
            f"{max(x[1] for x in all_rows):7.2f} {sum(not x[2] for x in all_rows):7}"
        )
    # cost/on-demand ÷ cost/optimum = optimum/on-demand, per window
    opt = [x[0] / x[1] for by in groups.values() for x in by[DEFAULT_POLICY]]
    lines.append(f"{'optimum':18} {statistics.fmean(opt):14.3f} {1:13.3f}")
    return "\n".join(lines)


def _checks(groups: dict, policies: list[str]) -> bool:
    ours = DEFAULT_POLICY
    all_ours = [x for by in groups.values() for x in by[ours]]
    mean = statistics.fmean(x[1] for x in all_ours)
    missed = sum(not x[2] for x in all_ours)
    margins = {
        g: statistics.fmean(x[1] for x in by[ours]) - statistics.fmean(x[1] for x in by["greedy"])
        for g, by in groups.items()
    }
    worse = [g for g, m in margins.items() if m > 1e-9]
    over = {g: m for g, m in margins.items() if m > GREEDY_MARGIN}
    print(
        f"\n{ours}: mean {mean:.3f}× the optimum (goal ≤ {GOAL}): "
        f"{'met' if mean <= GOAL else 'NOT met'}"
    )
    print(f"{ours}: deadlines missed: {missed}")
    print(
        f"{ours}: worst margin over greedy {max(margins.values()):+.4f} of the optimum (goal ≤ "
        f"{GREEDY_MARGIN}): {'met' if not over else 'NOT met'}; groups worse than greedy at all: "
        f"{len(worse)} of {len(groups)}"
        + "".join(f"\n  {g[0]} N={g[1]} {g[2]:g}x {margins[g]:+.4f}" for g in worse)
    )
    return mean <= GOAL and not missed and not over


if __name__ == "__main__":
    sys.exit(main())
