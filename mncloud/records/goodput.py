"""The goodput ledger: of what a run paid, how much trained the model, and where the rest went.

A pure function (`goodput_ledger`) over a run record and its telemetry (`Telemetry`: the
training steps with their times, the complete checkpoint steps, the final step);
`operate/telemetry.py` gathers the telemetry, `runs cost --breakdown`, `status` and the web
view show the result.

The billed time is the ledger's (`ledger.cost_segments`): each segment at its price, with
`record.nodes` nodes (one fewer per node lost and not yet joined again, under node recovery).
A launch (`launch`, `recovery`, `restart`) runs until the next one; its wall time is cut into
stretches, each given to one part, and every segment's node-seconds and dollars are split by
the stretches it overlaps. An example, one node, a checkpoint every 10 steps:

    launch 1  t=0    ┐ start-up: to the first step's start (its time less one median step)
              t=30   │ steps 1..14 (step 10 checkpointed); steps 1..10 useful, 11..14 redone
    preempted t=45   ┘ the step in flight when the nodes went: redone
    (gap)            waiting, unbilled: nothing ran (deadline mode; a new cluster)
    launch 2  t=60   ┐ recovery: provisioning, setup, start, loading step 10
              t=80   │ steps 11..30: useful (in the final model)
    finish    t=100  ┘ idle: after the last step until teardown

The parts, in node-seconds and dollars, add up to the ledger's total:
- useful: steps in the final model (or, before the end, in the newest complete checkpoint)
  and not trained again later;
- redone: steps trained again by a later launch, and a preempted launch's step in flight;
- unsaved: steps past the newest complete checkpoint, not (yet) trained again: at risk while
  the run lives, lost if it ended without saving them;
- startup ("start-up"): the run's first launch to its first step (less that step's own
  time): provisioning, setup, imports, the preflight, a cold start that any run pays;
- recovery: what a relaunch costs: from each later launch (after a preemption, an error, a
  storage outage, or a deadline run's switch) to its first step;
- checkpoint_stall: the seconds a step's telemetry says its save blocked (`ckpt_s`);
  without it, a save's stall is inside that step's time (and `unmeasured` says so);
- waiting: a replacement node from its start until it healed from a live peer (node
  recovery). Time with nothing billed (a deadline run waiting for its market, the gap between
  clusters, a node being provisioned) costs nothing: `unbilled_node_seconds` counts it;
- idle: after the last step until the launch ended (final save, exit, teardown);
- unknown: billed time no telemetry explains (a cloud run without per-step telemetry).
Goodput = useful ÷ total node-seconds; and dollars per 1,000 useful steps. A step mark may
stand for several steps (`StepMark.n`: a thinned row of a rank's telemetry rollup): its steps
are counted, and its time split between parts by its steps where the kept step or a redone
range falls inside it.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, Field

from mncloud.records.ledger import Segment, cost_segments
from mncloud.records.model import OPENS_SEGMENT, Event, RunRecord

if TYPE_CHECKING:
    from mncloud.telemetry.series import Series

PartName = Literal[
    "useful", "redone", "unsaved", "startup", "recovery", "checkpoint_stall", "waiting", "idle",
    "unknown",
]  # fmt: skip
PARTS: tuple[PartName, ...] = get_args(PartName)
#: Parts measured only with per-step telemetry.
STEP_PARTS: tuple[PartName, ...] = tuple(p for p in PARTS if p not in ("waiting", "unknown"))
LAUNCHES = ("launch", "recovery", "restart")


def part_label(part: str) -> str:
    """A part as people read it: `start-up`, `checkpoint stall`."""
    return "start-up" if part == "startup" else part.replace("_", " ")


class StepMark(BaseModel):
    """One finished training step, as the script reported it."""

    t: float
    """When the step finished (seconds since the epoch)."""
    step: int
    ckpt_s: float = 0.0
    """Seconds this step blocked on saving a checkpoint (0 when not reported)."""
    n: int = 1
    """The steps it stands for: itself and the `n - 1` before it (a thinned rollup's row,
    `telemetry.rollup`), their stalls summed in `ckpt_s`."""


class Telemetry(BaseModel):
    """What the run's scripts and bucket say beyond the record's events."""

    steps: list[StepMark] | None = None
    """Every finished step, all launches (or marks that stand for several: `StepMark.n`);
    None when the run has no per-step telemetry."""
    checkpoints: list[int] | None = None
    """Complete checkpoint steps now in the bucket; None when unknown."""
    final_step: int | None = None
    """The step of the final model, when the script wrote one."""


class Part(BaseModel):
    """One part of the ledger."""

    node_seconds: float = 0.0
    cost: float = 0.0
    """USD, at each segment's price (0 for unpriced segments)."""
    cents: int = 0
    """`cost` in whole cents, rounded so that the parts' cents add up to the total's."""
    steps: int = 0
    """Training steps in it (useful, redone, unsaved)."""


class GoodputLedger(BaseModel):
    """A run's billed node-seconds and dollars split by what they bought (module docstring)."""

    run_id: str
    launches: int
    parts: dict[str, Part]
    total_node_seconds: float
    total_cost: float
    """The cost ledger's total (`cost_summary(...).total`); the parts' costs add up to it."""
    goodput: float | None
    """useful ÷ total node-seconds; None without per-step telemetry or billed time."""
    cost_per_1k_useful_steps: float | None
    unbilled_node_seconds: float = 0.0
    """Node-seconds the run waited with nothing billed (see `waiting`)."""
    kept_step: int | None = None
    """The newest step in the final model or a complete checkpoint (the useful horizon)."""
    unmeasured: list[str] = Field(default_factory=list)
    """Parts the telemetry could not measure (their time is in `unknown` or in the steps)."""
    notes: list[str] = Field(default_factory=list)


Stretch = tuple[float, float, PartName]


def goodput_ledger(
    record: RunRecord, telemetry: Telemetry | None = None, now: float | None = None
) -> GoodputLedger:
    """The goodput ledger of a run (module docstring); pure: reads nothing but its arguments."""
    now = time.time() if now is None else now
    telemetry = telemetry or Telemetry()
    segments = cost_segments(record, now)
    opens = [e for e in sorted(record.events, key=lambda e: e.time) if e.kind in OPENS_SEGMENT]
    launch_idx = [i for i, e in enumerate(opens) if e.kind in LAUNCHES]
    parts = {name: Part() for name in PARTS}
    notes: list[str] = []
    kept = _kept_step(telemetry)
    stretches: list[Stretch] = []
    if telemetry.steps is not None:
        marks = _by_launch(telemetry.steps, [opens[i].time for i in launch_idx])
        retrained = _retrained(marks)
        unreported = _unreported(marks)
        for k, i in enumerate(launch_idx):
            last = launch_idx[k + 1] - 1 if k + 1 < len(launch_idx) else len(segments) - 1
            seg_end = segments[last]
            stretches += _launch_stretches(
                opens[i].time, seg_end.end, seg_end.ended_by, seg_end.open, marks[k],
                retrained[k], kept, telemetry.final_step, parts, unreported[k],
                "startup" if k == 0 else "recovery",
            )  # fmt: skip
    heals = _heal_windows(record, opens, segments)
    timeline = _Timeline(stretches)
    for seg, active in zip(segments, _active_nodes(record, opens), strict=False):
        _split_segment(seg, active, timeline, heals.get(seg.index), parts)
    unbilled = _unbilled(record, segments, opens, now)
    total_ns = sum(p.node_seconds for p in parts.values())
    total_cost = sum(s.cost or 0.0 for s in segments)
    if any(s.cost is None for s in segments):
        notes.append("some segments have no known price: their node-seconds cost $0 here")
    unmeasured = _unmeasured(telemetry, kept, notes)
    _round_to_cents(parts, total_cost)
    useful = parts["useful"]
    has_steps = telemetry.steps is not None and total_ns > 0
    return GoodputLedger(
        run_id=record.run_id,
        launches=len(launch_idx),
        parts=parts,
        total_node_seconds=total_ns,
        total_cost=total_cost,
        goodput=useful.node_seconds / total_ns if has_steps else None,
        cost_per_1k_useful_steps=(
            total_cost / useful.steps * 1000 if has_steps and useful.steps else None
        ),
        unbilled_node_seconds=unbilled,
        kept_step=kept,
        unmeasured=unmeasured,
        notes=notes,
    )


def _round_to_cents(parts: dict[str, Part], total: float) -> None:
    """Whole cents per part that add up to the total's (largest remainder first)."""
    exact = {name: max(0.0, p.cost) * 100 for name, p in parts.items()}
    for name, value in exact.items():
        parts[name].cents = int(value)
    short = max(0, round(total * 100) - sum(p.cents for p in parts.values()))
    for name in sorted(exact, key=lambda n: exact[n] - int(exact[n]), reverse=True)[:short]:
        parts[name].cents += 1


def _kept_step(telemetry: Telemetry) -> int | None:
    """The useful horizon: the final model's step, or the newest complete checkpoint."""
    known = [s for s in (*(telemetry.checkpoints or []), telemetry.final_step) if s is not None]
    return max(known) if known else None


def _unmeasured(telemetry: Telemetry, kept: int | None, notes: list[str]) -> list[str]:
    if telemetry.steps is None:
        notes.append("no per-step telemetry: only waiting is measured, the rest is unknown")
        return list(STEP_PARTS)
    out = []
    if not any(m.ckpt_s for m in telemetry.steps):
        out.append("checkpoint_stall")
        notes.append("steps carry no ckpt_s: a save's stall is inside its step's time")
    if kept is None:
        notes.append("no checkpoint or final step known: every step not redone counts useful")
    return out


def _by_launch(steps: Iterable[StepMark], starts: list[float]) -> list[list[StepMark]]:
    """The marks of each launch (by time), one per step (the earliest), in time order. Marks
    that stand for several steps (`StepMark.n`) stand, once merged, for the steps their
    launch's marks cover since the mark before (no step counted twice)."""
    out: list[dict[int, StepMark]] = [{} for _ in starts]
    claims: list[list[Span]] = [[] for _ in starts]
    for mark in sorted(steps, key=lambda m: m.t):
        k = max((i for i, s in enumerate(starts) if s <= mark.t), default=None)
        if k is None:
            continue
        claims[k].append((mark.step - mark.n + 1, mark.step))
        seen = out[k].get(mark.step)
        if seen is None:
            out[k][mark.step] = mark
        elif mark.ckpt_s > seen.ckpt_s:  # node recovery: several replicas report a step
            out[k][mark.step] = seen.model_copy(update={"ckpt_s": mark.ckpt_s})
    found = []
    for marks, claimed in zip(out, claims, strict=True):
        if any(m.n != 1 for m in marks.values()):
            covered, low = _union(claimed), None
            for step in sorted(marks):
                n = _count(covered, covered[0][0] if low is None else low + 1, step)
                marks[step], low = marks[step].model_copy(update={"n": max(1, n)}), step
        found.append(sorted(marks.values(), key=lambda m: m.t))
    return found


Span = tuple[int, int]


def _union(spans: Iterable[Span]) -> list[Span]:
    """Disjoint, sorted inclusive step ranges covering `spans`."""
    out: list[Span] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _count(spans: list[Span], lo: int, hi: int) -> int:
    """Steps of [lo, hi] the disjoint sorted `spans` cover."""
    return sum(max(0, min(b, hi) - max(a, lo) + 1) for a, b in spans if a <= hi and b >= lo)


def _covers(spans: list[Span], step: int) -> bool:
    i = bisect.bisect_right(spans, (step, math.inf)) - 1
    return i >= 0 and spans[i][0] <= step <= spans[i][1]


def _steps_of(marks: list[StepMark]) -> list[Span]:
    return _union((m.step - m.n + 1, m.step) for m in marks)


def _retrained(marks: list[list[StepMark]]) -> list[list[Span]]:
    """Per launch, the steps a later launch trained again."""
    later: list[Span] = []
    out: list[list[Span]] = []
    for launch in reversed(marks):
        steps = _steps_of(launch)
        out.append(_union((max(a, c), min(b, d)) for a, b in steps for c, d in later
                          if max(a, c) <= min(b, d)))  # fmt: skip
        later = _union([*later, *steps])
    return out[::-1]


def _unreported(marks: list[list[StepMark]]) -> list[range]:
    """Per launch, the steps it trained past its last reported one that no launch reported:
    those up to the step the next launch resumed after (it loaded them from a checkpoint this
    launch saved), their marks lost with the nodes (a kill before the telemetry's last
    segment was written)."""
    reported = _union(span for launch in marks for span in _steps_of(launch))
    out = []
    for k, launch in enumerate(marks):
        later = next((nxt[0].step for nxt in marks[k + 1 :] if nxt), None)
        top = launch[-1].step if launch else None
        if top is None or later is None or later - 1 <= top:
            out.append(range(0))
            continue
        steps = range(top + 1, later)
        out.append(steps if not _count(reported, top + 1, later - 1) else range(0))
    return out


def _step_part(step: int, retrained: list[Span], kept: int | None) -> PartName:
    if _covers(retrained, step):
        return "redone"
    return "useful" if kept is None or step <= kept else "unsaved"


def _pieces(mark: StepMark, retrained: list[Span], kept: int | None) -> list[tuple[int, PartName]]:
    """The steps a mark stands for, in step order, as (steps, part) runs."""
    lo, hi = mark.step - mark.n + 1, mark.step
    if lo == hi:
        return [(1, _step_part(hi, retrained, kept))]
    cuts = {lo, hi + 1} | {x for a, b in retrained for x in (a, b + 1) if lo < x <= hi}
    if kept is not None and lo <= kept < hi:
        cuts.add(kept + 1)
    out: list[tuple[int, PartName]] = []
    for a, b in itertools.pairwise(sorted(cuts)):
        part = _step_part(a, retrained, kept)
        if out and out[-1][1] == part:
            out[-1] = (out[-1][0] + b - a, part)
        else:
            out.append((b - a, part))
    return out


def _step_seconds(marks: list[StepMark]) -> float:
    """The median step's seconds: of the gaps between marks, each per step of the steps it
    stands for (weighted by them)."""
    gaps = [((b.t - a.t) / b.n, b.n) for a, b in itertools.pairwise(marks)]
    if all(w == 1 for _, w in gaps):
        return statistics.median(g for g, _ in gaps) if gaps else 0.0
    ordered, total = sorted(gaps), sum(w for _, w in gaps)

    def at(i: int) -> float:
        for value, weight in ordered:
            if i < weight:
                return value
            i -= weight
        return ordered[-1][0]

    return (at((total - 1) // 2) + at(total // 2)) / 2


def _launch_stretches(
    start: float,
    end: float,
    ended_by: str | None,
    is_open: bool,
    marks: list[StepMark],
    retrained: list[Span],
    kept: int | None,
    final: int | None,
    parts: dict[str, Part],
    unreported: range = range(0),
    coming: PartName = "recovery",
) -> list[Stretch]:
    """One launch's wall time [start, end) cut into parts; counts the steps into `parts`.
    Its time to the first step is `coming`: the first launch's start-up, a later's recovery.
    A preempted launch's time after its last step is the step in flight (redone), unless that
    step was the final one (`final`): then it is the final save and teardown (idle). Steps it
    trained whose marks were lost (`unreported`) take their share of that time first, at the
    median step."""
    if not marks:
        return [(start, end, coming)]
    step_s = _step_seconds(marks)
    first = max(start, marks[0].t - step_s)
    out: list[Stretch] = [(start, first, coming)]
    prev = first
    for mark in marks:
        pieces = _pieces(mark, retrained, kept)
        stall = min(max(0.0, mark.ckpt_s), max(0.0, mark.t - prev))
        at, done = prev, mark.t - stall
        for k, (steps, part) in enumerate(pieces):
            parts[part].steps += steps
            upto = done if k == len(pieces) - 1 else at + (done - prev) * steps / mark.n
            out.append((at, upto, part))
            at = upto
        out.append((mark.t - stall, mark.t, "checkpoint_stall"))
        prev = mark.t
    for step in unreported:
        part = _step_part(step, retrained, kept)
        parts[part].steps += 1
        out.append((prev, min(end, prev + step_s), part))
        prev = max(prev, min(end, prev + step_s))
    if is_open:
        tail: PartName = "unsaved"  # the step being trained now
    elif ended_by == "preemption" and (final is None or marks[-1].step < final):
        tail = "redone"  # the step in flight when the nodes went
    else:
        tail = "idle"
    out.append((prev, max(prev, end), tail))
    return [s for s in out if s[1] > s[0]]


def _active_nodes(record: RunRecord, opens: list[Event]) -> list[int]:
    """Per segment (one per opening event): the nodes billed in it."""
    missing, out = 0, []
    for event in opens:
        if event.kind in LAUNCHES:
            missing = 0
        elif event.kind == "node-lost":
            missing = min(record.nodes - 1, missing + 1)
        elif event.kind == "node-joined":
            missing = max(0, missing - 1)
        out.append(record.nodes - missing)
    return out


def _heal_windows(
    record: RunRecord, opens: list[Event], segments: list[Segment]
) -> dict[int, tuple[float, float]]:
    """Per segment opened by a `node-joined`: the replacement's time until it healed."""
    out: dict[int, tuple[float, float]] = {}
    events = sorted(record.events, key=lambda e: e.time)
    for event, seg in zip(opens, segments, strict=False):
        if event.kind != "node-joined":
            continue
        healed = next(
            (e.time for e in events
             if e.kind == "node-healed" and e.time >= event.time and e.node == event.node),
            seg.end,
        )  # fmt: skip
        out[seg.index] = (seg.start, min(healed, seg.end))
    return out


class _Timeline:
    """The stretches sorted by start, found by time in O(log n) (a run page with 10,000 events
    splits every segment over them)."""

    def __init__(self, stretches: list[Stretch]) -> None:
        self.stretches = sorted(stretches, key=lambda s: s[0])
        self.reach = list(itertools.accumulate((b for _, b, _ in self.stretches), max))

    def within(self, lo: float, hi: float) -> Iterator[Stretch]:
        """The stretches that may overlap [lo, hi): every earlier one ends by `lo`."""
        for stretch in itertools.islice(self.stretches, bisect.bisect_right(self.reach, lo), None):
            if stretch[0] >= hi:
                return
            yield stretch


def _split_segment(
    seg: Segment,
    active: int,
    timeline: _Timeline,
    heal: tuple[float, float] | None,
    parts: dict[str, Part],
) -> None:
    """Add a segment's node-seconds and cost to the parts of the stretches it overlaps."""
    length = seg.end - seg.start
    if length <= 0:
        return
    per_node_s = (seg.cost or 0.0) / length / active  # dollars per node-second

    def add(part: str, seconds: float, nodes: float) -> None:
        parts[part].node_seconds += seconds * nodes
        parts[part].cost += seconds * nodes * per_node_s

    covered = 0.0
    for a, b, part in timeline.within(seg.start, seg.end):
        lo, hi = max(a, seg.start), min(b, seg.end)
        if hi > lo:
            add(part, hi - lo, active)
            covered += hi - lo
    if length - covered > 1e-9:
        add("unknown", length - covered, active)
    if heal is not None and heal[1] > heal[0]:  # one node waits: move it from where it was
        moved = 0.0
        for a, b, part in timeline.within(heal[0], heal[1]):
            lo, hi = max(a, heal[0]), min(b, heal[1])
            if hi > lo:
                add(part, lo - hi, 1)
                add("waiting", hi - lo, 1)
                moved += hi - lo
        rest = heal[1] - heal[0] - moved
        if rest > 1e-9:  # not covered by a stretch: it was in unknown
            add("unknown", -rest, 1)
            add("waiting", rest, 1)


def _unbilled(record: RunRecord, segments: list[Segment], opens: list[Event], now: float) -> float:
    """Node-seconds with nothing billed: gaps between launches (and after a preemption of a
    run that is not over), and lost nodes until their replacement joined."""
    total = 0.0
    for a, b in itertools.pairwise(segments):
        total += max(0.0, b.start - a.end) * record.nodes
    last = segments[-1] if segments else None
    if last and not last.open and last.ended_by == "preemption" and not record.finished:
        total += max(0.0, now - segments[-1].end) * record.nodes
    for seg, active in zip(segments, _active_nodes(record, opens), strict=False):
        total += (record.nodes - active) * (seg.end - seg.start)
    return total


def series_marks(series: Series) -> list[StepMark]:
    """The goodput ledger's step marks: one per step of each of the series' launches (the
    earliest rank's time, the largest stall, the most steps a thinned row stands for), as
    the ledger merges them, so that it handles one rank's rows, not every rank's."""
    group = {tag: k for k, launch in enumerate(series.launches()) for tag in launch.tags}
    best: dict[tuple[int, int], list[Any]] = {}
    for r in series.steps:  # by time: the first of a step is its earliest
        seen = best.setdefault((group.get(r.launch, -1), r.step), [r.t, r.step, r.ckpt_s, r.n])
        seen[2], seen[3] = max(seen[2], r.ckpt_s), max(seen[3], r.n)
    return [StepMark(t=t, step=step, ckpt_s=c, n=n) for t, step, c, n in best.values()]
