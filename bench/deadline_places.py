"""Benchmark: deadline policies across several places, against the K-place offline optimum.

The aligned traces under ../shared/traces (several places measured over the same clock):
`availability/1-node/aws-02-15-2023` (4 zones, 45 days, 195 s ticks) and
`preemption/1-node/aws-04-22-2023` (2 regions, 7 days, 32 s ticks). The grid, as issue #27
states its scale: 12 h of work by a 24 h deadline and 24 h by 36 h (`--wide`: work 12/18/24 h ×
deadline 1.5/2/2.5/3 × the work), a window every 6 h that fits (`--every-h`), restart overhead
390 s (`--overhead-s`), p3.2xlarge prices ($0.918 spot in every place, $3.06 on-demand).

Per window: the exact K-place optimum (`replay_places.optimum_places`), every multi-place
policy (`places.PLACE_POLICIES`) replayed over all places, and our single-place policy in each
place alone. Per group (place set × deadline factor) it prints each policy's mean cost over
the optimum, and ours alone in the place that was cheapest in hindsight. Checks: ours ≤ 1.03×
the optimum on the mean, never worse than greedy over places by more than 0.005 of the optimum
in any group, no deadline missed.

    .venv/bin/python bench/deadline_places.py [--workers 2] [--max-windows K] [--wide]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from mncloud.deadline.places import PLACE_POLICIES, Place, PlacesJob, make_places_policy
from mncloud.deadline.policy import DEFAULT_POLICY, Job, make_policy
from mncloud.deadline.replay import replay, window_starts
from mncloud.deadline.replay_places import align, availability, optimum_places, replay_places
from mncloud.errors import SpecError
from mncloud.plan.traces import load_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
SETS = ("availability/1-node/aws-02-15-2023", "preemption/1-node/aws-04-22-2023")
GRID = ((12, 2.0), (24, 1.5))  #: (work h, deadline ÷ work)
WIDE = tuple((w, f) for w in (12, 18, 24) for f in (1.5, 2.0, 2.5, 3.0))
SPOT, ON_DEMAND = 0.918, 3.06
GOAL, GREEDY_MARGIN = 1.03, 0.005
ALONE = "alone"  #: our single-place policy in one place (the hindsight-cheapest, per group)

Case = tuple[str, float, float, float, float, int]  # set, work h, factor, overhead s, every h, max
Row = tuple[str, float, float, str, float, float, bool]  # set, work, factor, policy, ×opt, ×od, met


def _cell(case: Case) -> list[Row]:
    """Rows for one grid cell: every window, every policy."""
    folder, work, factor, overhead_s, every_h, max_windows = case
    paths = sorted((TRACES / folder).glob("*.json"))
    traces = [load_trace(p) for p in paths]
    gap, length = align(traces, [p.stem for p in paths])
    job = Job.build(
        nodes=1,
        hours=work,
        deadline_s=work * factor * 3600,
        overhead_s=overhead_s,
        gap_s=gap,
        spot_price=SPOT,
        on_demand_price=ON_DEMAND,
    )
    pjob = PlacesJob(job, tuple(Place(p.stem, SPOT) for p in paths))
    avail = availability(traces, 1, length)
    try:
        starts = window_starts(traces[0], job, every_h * 3600, length=avail.shape[1])
    except SpecError:
        return []
    if max_windows and len(starts) > max_windows:
        starts = [starts[i * len(starts) // max_windows] for i in range(max_windows)]
    best = optimum_places(pjob, avail, starts)
    od = job.on_demand_cost()
    rows: list[Row] = []
    for start, opt in zip(starts, best, strict=True):
        for name in PLACE_POLICIES:
            r = replay_places(make_places_policy(name, pjob), avail, start)
            rows.append((folder, work, factor, name, r.cost / opt, r.cost / od, r.met_deadline))
        for k, place in enumerate(pjob.places):
            r = replay(make_policy(DEFAULT_POLICY, job), avail[k], start)
            alone = f"{ALONE}:{place.name}"
            rows.append((folder, work, factor, alone, r.cost / opt, r.cost / od, r.met_deadline))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-windows", type=int, default=0, help="at most K windows per cell")
    parser.add_argument("--overhead-s", type=float, default=390.0)
    parser.add_argument("--every-h", type=float, default=6.0)
    parser.add_argument("--wide", action="store_true", help="work 12/18/24 h × 1.5–3× deadlines")
    args = parser.parse_args()
    missing = [s for s in SETS if not (TRACES / s).is_dir()]
    if missing:
        print(f"skipped: no traces at {TRACES / missing[0]}")
        return 0
    began = time.perf_counter()
    cases = [
        (s, w, f, args.overhead_s, args.every_h, args.max_windows)
        for s in SETS
        for w, f in (WIDE if args.wide else GRID)
    ]
    with multiprocessing.Pool(args.workers) as pool:
        rows = [row for part in pool.imap_unordered(_cell, cases) for row in part]
    groups: dict[tuple[str, float, float], dict[str, list[tuple[float, float, bool]]]] = (
        defaultdict(lambda: defaultdict(list))
    )
    for folder, work, factor, name, vs_opt, vs_od, met in rows:
        groups[(folder, work, factor)][name].append((vs_opt, vs_od, met))
    print(_report(groups))
    ok = _checks(groups)
    windows = sum(len(by[DEFAULT_POLICY]) for by in groups.values())
    print(f"{windows} windows; restart {args.overhead_s:g} s; {time.perf_counter() - began:.0f} s")
    return 0 if ok else 1


def _alone(by: dict[str, list]) -> list[tuple[float, float, bool]]:
    """Our single-place policy in the place that was cheapest in hindsight for the group."""
    alone = [k for k in by if k.startswith(f"{ALONE}:")]
    return by[min(alone, key=lambda k: statistics.fmean(x[0] for x in by[k]))]


def _report(groups: dict) -> str:
    names = list(PLACE_POLICIES)
    head = f"{'group (places, work, deadline)':40} {'win':>4} " + " ".join(
        f"{n[:8]:>8}" for n in names
    )
    lines = [
        "cost / K-place optimum (means over windows); 'alone': ours in the hindsight-best place",
        head + f" {'alone':>8} {'opt/od':>7}",
    ]
    for (folder, work, factor), by in sorted(groups.items()):
        cells = [_mean_cell(by[n]) for n in names] + [_mean_cell(_alone(by))]
        opt_od = statistics.fmean(x[1] / x[0] for x in by[DEFAULT_POLICY])
        label = f"{_label(folder)} {work:g}h/{work * factor:g}h"
        lines.append(
            f"{label:40} {len(by[DEFAULT_POLICY]):4} " + " ".join(cells) + f" {opt_od:7.3f}"
        )
    lines.append("")
    lines.append(f"{'policy':18} {'cost/optimum':>13} {'worst':>7} {'missed':>7}")
    for name in [*names, ALONE]:
        rows = [x for by in groups.values() for x in (_alone(by) if name == ALONE else by[name])]
        lines.append(
            f"{name:18} {statistics.fmean(x[0] for x in rows):13.3f} "
            f"{max(x[0] for x in rows):7.3f} {sum(not x[2] for x in rows):7}"
        )
    return "\n".join(lines)


def _label(folder: str) -> str:
    """`4 zones aws-02-15-2023`-style short name of a place set."""
    k = len(list((TRACES / folder).glob("*.json")))
    return f"{k} {'zones' if folder.startswith('availability') else 'regions'} {folder[-14:]}"


def _mean_cell(rows: list[tuple[float, float, bool]]) -> str:
    misses = sum(not m for *_, m in rows)
    return f"{statistics.fmean(x[0] for x in rows):7.3f}{'!' if misses else ' '}"


def _checks(groups: dict) -> bool:
    ours = [x for by in groups.values() for x in by[DEFAULT_POLICY]]
    mean = statistics.fmean(x[0] for x in ours)
    missed = sum(not x[2] for x in ours)
    margins = {
        g: statistics.fmean(x[0] for x in by[DEFAULT_POLICY])
        - statistics.fmean(x[0] for x in by["greedy"])
        for g, by in groups.items()
    }
    worse = {g: m for g, m in margins.items() if m > GREEDY_MARGIN}
    print(f"\n{DEFAULT_POLICY}: mean {mean:.3f}× the optimum (goal ≤ {GOAL}): "
          f"{'met' if mean <= GOAL else 'NOT met'}")  # fmt: skip
    print(f"{DEFAULT_POLICY}: deadlines missed: {missed}")
    print(
        f"{DEFAULT_POLICY}: worst margin over greedy {max(margins.values()):+.4f} of the optimum "
        f"(goal ≤ {GREEDY_MARGIN}); groups over it: {len(worse)} of {len(groups)}"
        + "".join(
            f"\n  {_label(g[0])} {g[1]:g}h/{g[1] * g[2]:g}h {m:+.4f}" for g, m in worse.items()
        )
    )
    return mean <= GOAL and not missed and not worse


if __name__ == "__main__":
    sys.exit(main())
