"""Run-time market decision for a job with a deadline: SPOT, ON_DEMAND or NONE (wait).

The one place this decision is made. Pure: no I/O, no clock; a policy sees only the past and
the present (`Observation`) and the job's constants (`Job`), and answers a `Mode`. Replay
(`deadline.replay`) feeds it a real spot trace; the live controller feeds it the run's progress.

Time is counted in *ticks* of `Job.gap_seconds` (a trace's `gap_seconds`, or the controller's
decision interval). `ticks_ceil`/`ticks_floor` turn whole seconds into ticks without floating
point error: 12 h of 300 s ticks is 144, not 145.

Policies live in a registry by name (`POLICIES`, `make_policy`), SkyPilot recovery-strategy
style; each class documents its design decision with an example sequence of events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from mncloud.errors import SpecError


class Mode(str, Enum):
    """What the job's cluster is in one tick."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    NONE = "none"


def seconds(value: float) -> int:
    """A duration as whole seconds (`30h` → 108000), rounding away float noise."""
    return round(value)


def ticks_ceil(duration_s: float, gap_s: int) -> int:
    """Ticks needed to cover a duration: ceil(duration / gap), in integer arithmetic."""
    return -(-seconds(duration_s) // gap_s)


def ticks_floor(duration_s: float, gap_s: int) -> int:
    """Whole ticks that fit in a duration: floor(duration / gap), in integer arithmetic."""
    return seconds(duration_s) // gap_s


@dataclass(frozen=True)
class Job:
    """A job's constants, in ticks: what every decision of one run shares."""

    nodes: int
    gap_seconds: int
    work_ticks: int  #: ticks of work the job needs: ceil(hours / gap)
    deadline_ticks: int  #: the work must be done within floor(deadline / gap) ticks
    overhead_ticks: int  #: billed ticks without progress on every launch: ceil(overhead / gap)
    spot_price: float  #: $ per node-hour
    on_demand_price: float  #: $ per node-hour

    @classmethod
    def build(
        cls,
        *,
        nodes: int,
        hours: float,
        deadline_s: float,
        overhead_s: float,
        gap_s: int,
        spot_price: float,
        on_demand_price: float,
    ) -> Job:
        """A Job from hours and seconds; raises SpecError when the deadline cannot be met."""
        if nodes < 1 or gap_s < 1 or hours <= 0 or overhead_s < 0:
            raise SpecError("nodes, hours and the trace's gap_seconds must be positive")
        if spot_price < 0 or on_demand_price <= 0:
            raise SpecError("prices must be positive")
        if deadline_s <= 0:
            raise SpecError(f"deadline {deadline_s / 3600:g} h: it must be positive")
        job = cls(
            nodes=nodes,
            gap_seconds=gap_s,
            work_ticks=ticks_ceil(hours * 3600, gap_s),
            deadline_ticks=ticks_floor(deadline_s, gap_s),
            overhead_ticks=ticks_ceil(overhead_s, gap_s),
            spot_price=spot_price,
            on_demand_price=on_demand_price,
        )
        if job.deadline_ticks < job.min_ticks:
            raise SpecError(
                f"deadline {deadline_s / 3600:g} h is too short: {hours:g} h of work plus one "
                f"restart ({overhead_s / 60:g} min) on on-demand needs "
                f"{job.hours(job.min_ticks):g} h; the earliest feasible deadline is "
                f"{job.hours(job.min_ticks):g} h"
            )
        return job

    @property
    def min_ticks(self) -> int:
        """Ticks to finish on on-demand from the start: one launch, then all the work."""
        return self.overhead_ticks + self.work_ticks

    def hours(self, ticks: int) -> float:
        """Ticks as hours."""
        return ticks * self.gap_seconds / 3600

    def tick_cost(self, mode: Mode) -> float:
        """$ for one tick of the whole cluster in a mode."""
        price = {Mode.SPOT: self.spot_price, Mode.ON_DEMAND: self.on_demand_price}.get(mode, 0.0)
        return self.nodes * price * self.gap_seconds / 3600

    def on_demand_cost(self) -> float:
        """$ to run the whole job on on-demand: one launch, then the work."""
        return self.min_ticks * self.tick_cost(Mode.ON_DEMAND)


@dataclass(frozen=True)
class Observation:
    """What a decision may see: the past and the present, never the future."""

    tick: int  #: ticks since the start (this decision is for tick `tick`)
    work_done: int  #: ticks of work done so far
    mode: Mode  #: the cluster's mode now (NONE after a preemption)
    overhead_left: int  #: launch overhead ticks still to pay in `mode` before progress
    spot_now: bool  #: spot capacity for all N nodes is there this tick
    history: Sequence[bool]  #: spot capacity at ticks 0..tick (the last entry is `spot_now`)


@dataclass(frozen=True)
class Slack:
    """The deadline arithmetic of one decision, in ticks."""

    time_left: int  #: ticks until the deadline, this one included
    work_left: int
    slack: int  #: time_left - work_left: ticks the job may still spend without progress

    @classmethod
    def of(cls, job: Job, obs: Observation) -> Slack:
        time_left = job.deadline_ticks - obs.tick
        work_left = job.work_ticks - obs.work_done
        return cls(time_left, work_left, time_left - work_left)


def safe(job: Job, obs: Observation, mode: Mode) -> bool:
    """Whether choosing `mode` now still leaves a way to finish on on-demand in time.

    The safety net every policy obeys: after this tick there must remain time for one more
    launch (its overhead) and all the work left, should spot vanish at the next tick. Running
    on-demand productively is always safe once the job got there safely.
    """
    s = Slack.of(job, obs)
    if mode is Mode.ON_DEMAND:
        return True
    progress = int(mode is Mode.SPOT and obs.mode is Mode.SPOT and obs.overhead_left == 0)
    return s.time_left - 1 >= job.overhead_ticks + s.work_left - progress


def smaller_world_breakeven(job: Job, offered: int) -> float:
    """Ticks the wait for the whole gang must still last for training meanwhile on `offered`
    < N nodes to pay (`--min-nodes`, `control/elastic.py`).

    The smaller world keeps the global batch, so a tick on k nodes does k/N of a tick's work
    (slower steps) at k/N of the gang's price: per unit of work spot costs the same. What it
    adds is launches: its own (o ticks without progress) and the one that grows it back, which
    the gang waiting would not pay (o ticks of the whole gang). Over a wait of w ticks it gains
    (w − o)·k/N ticks of work and loses o, so it pays when w > o·(1 + N/k). Example: o = 2,
    N = 4, k = 2: a wait expected to last more than 6 ticks; k = 1: more than 10."""
    return job.overhead_ticks * (1 + job.nodes / max(1, offered))


class GangWait:
    """The shortfalls of the gang's nodes, looked at tick by tick: how long the current one is
    expected to last still (`expected`). One rule for the controller (`expected_gang_wait`) and
    the deadline replay's `--min-nodes` ride, which looks once a tick."""

    def __init__(self) -> None:
        self.ended_sum = self.ended = self.length = 0

    def look(self, short: bool) -> None:
        """One tick: the gang short of nodes (`short`) or whole."""
        if short:
            self.length += 1
        elif self.length:
            self.ended_sum += self.length
            self.ended += 1
            self.length = 0

    def expected(self) -> float:
        """The mean length of the shortfalls that ended before the current one, less its age;
        with none ended yet, without end (the replacement is not coming, as far as anyone
        knows)."""
        if not self.ended:
            return float("inf")
        return max(0.0, self.ended_sum / self.ended - self.length)


def expected_gang_wait(counts: Sequence[int], nodes: int) -> float:
    """Ticks the current shortfall (the trailing ticks of `counts` below `nodes`) is expected
    to last still (`GangWait.expected`)."""
    wait = GangWait()
    for count in counts:
        wait.look(count < nodes)
    return wait.expected()


def smaller_world_pays(job: Job, offered: int, counts: Sequence[int]) -> bool:
    """Whether to train now on `offered` < N spot nodes rather than wait for all N (the prices
    above): the wait expected still is longer than the break-even."""
    return expected_gang_wait(counts, job.nodes) > smaller_world_breakeven(job, offered)


PAST_DEADLINE = "past the deadline: finishing on on-demand"
"""Why a run past its deadline runs on on-demand (`past_deadline`)."""


def past_deadline(job: Job, tick: int) -> bool:
    """Whether tick `tick` is past the job's deadline. From then on no policy decides: the run
    finishes on on-demand, so the work gets done and its cost stays comparable with the
    optimum's. The controller and both replays ask here, before any policy."""
    return tick >= job.deadline_ticks


class Policy:
    """Base: `decide` answers the mode for this tick. A fresh instance serves one run."""

    name = ""

    def __init__(self, job: Job) -> None:
        self.job = job

    def decide(self, obs: Observation) -> Mode:
        """The mode for this tick; SPOT only when `obs.spot_now`."""
        raise NotImplementedError


POLICIES: dict[str, type[Policy]] = {}
DEFAULT_POLICY = "adaptive"


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add a policy to the registry under its `name`."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, job: Job) -> Policy:
    """A fresh policy by registry name; SpecError naming the choices if unknown."""
    try:
        return POLICIES[name](job)
    except KeyError:
        raise SpecError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def _spot_entry_ok(job: Job, obs: Observation) -> bool:
    """Whether a spot launch can pay its overhead and still leave one on-demand launch."""
    return Slack.of(job, obs).slack >= 2 * job.overhead_ticks + 1


@register
class OnDemandPolicy(Policy):
    """On-demand from start to end: the baseline every saving is measured against.

    Events: launch on-demand (overhead), work, done. Never waits, never preempted, costs
    `Job.on_demand_cost()` exactly.
    """

    name = "on-demand"

    def decide(self, obs: Observation) -> Mode:
        return Mode.ON_DEMAND


@register
class GreedyPolicy(Policy):
    """Spot whenever there, else wait; on-demand only when the safety net fires, then for good.

    Events: spot (work) → preempted → wait 3 h → spot again → preempted → wait … until the
    slack left equals one restart: launch on-demand and finish there, even if spot returns an
    hour later. Cheap while spot is plentiful; when it is scarce it burns the whole slack early
    and ends with a long on-demand tail the optimum would have spread into the gaps.
    """

    name = "greedy"

    def decide(self, obs: Observation) -> Mode:
        if obs.mode is Mode.ON_DEMAND:
            return Mode.ON_DEMAND
        if obs.spot_now and obs.mode is Mode.SPOT and safe(self.job, obs, Mode.SPOT):
            return Mode.SPOT
        if obs.spot_now and _spot_entry_ok(self.job, obs):
            return Mode.SPOT
        return Mode.NONE if safe(self.job, obs, Mode.NONE) else Mode.ON_DEMAND


@register
class UniformProgressPolicy(Policy):
    """Uniform Progress (Can't Be Late, NSDI 2024): keep up with the straight line to the deadline.

    As the paper's `rc_cr_threshold` strategy (skypilot-org's simulator) has it. The line:
    `work × elapsed / deadline`. Events: spot when there; spot gone and the work done ahead of
    the line → wait; behind it → on-demand. Once on on-demand, stay there while spot is away
    (never on-demand → wait → on-demand again: each relaunch costs a restart), and leave it
    for spot only when ahead of where the line will be two restarts from now. Near the deadline
    (work + 2 restarts ≥ time left) on-demand for good; a spot cluster already working is kept
    till preempted. Spends on-demand early, in the gaps, keeping slack for spot near the end:
    good for tight deadlines; with slack of 50–200 % of the work (bench/deadline.py) it runs
    on-demand that greedy's waiting would have saved.
    """

    name = "uniform-progress"

    def decide(self, obs: Observation) -> Mode:
        job, s, o = self.job, Slack.of(self.job, obs), self.job.overhead_ticks
        rate = job.work_ticks / job.deadline_ticks
        mode = Mode.SPOT if obs.spot_now else Mode.NONE
        if obs.work_done < obs.tick * rate and not obs.spot_now:  # behind the line
            mode = Mode.ON_DEMAND
        if obs.mode is Mode.ON_DEMAND and (
            not obs.spot_now or (obs.tick + 2 * o) * rate >= obs.work_done
        ):
            mode = Mode.ON_DEMAND
        if s.work_left + 2 * o >= s.time_left and obs.mode is not Mode.SPOT:
            mode = Mode.ON_DEMAND
        if s.work_left + o >= s.time_left:
            working = obs.mode is Mode.SPOT and obs.overhead_left == 0 and obs.spot_now
            mode = Mode.SPOT if working else Mode.ON_DEMAND
        if mode is Mode.SPOT and obs.mode is not Mode.SPOT and not _spot_entry_ok(job, obs):
            mode = Mode.ON_DEMAND if obs.mode is Mode.ON_DEMAND else Mode.NONE
        return mode if safe(job, obs, mode) else Mode.ON_DEMAND


@register
class AdaptivePolicy(Policy):
    """Ours: greedy while slack is ample, on-demand in the gaps once it runs low, back to spot
    when spot has lasted long enough to be worth two restarts.

    Events (10 h of work, 15 h deadline, 10 min restarts): spot 2 h → preempted → wait (slack
    5 h, ample) → spot 1 h → preempted → wait 2 h → slack down to the reserve (2 h, a quarter
    of the 8 h of work left): launch on-demand *now*, not at the last minute as greedy does →
    spot returns; leave on-demand once spot has stayed up 15 min (spot runs on the traces have
    a decreasing hazard: half die within 20–30 min, yet the mean run is 1.5–3 h) → spot 3 h →
    preempted → on-demand again, and stay on it while spot is away (leaving it to wait would
    cost a relaunch), the reserve still holding slack for the next round trip. Had the spot
    seen so far (net of one restart per spot run, pooled with a prior of 50 % over 6 h) been
    enough to do the work left in the time left, it would have kept waiting, as greedy does.
    The safety net guarantees the deadline throughout.

    Hedge against the patience: each return to spot is a bet on the decreasing hazard. Where
    spot flaps (runs of 15–20 min, over and over), on-demand → spot (up 15 min) → preempted
    before the launch's overhead is paid → on-demand again pays two restarts for no work, while
    greedy, waiting, just rides the short runs. One such lost bet doubles the patience (30 min)
    for the rest of the run (bench/deadline.py, 16-node us-east-2b: N=8 1.5x went from 0.025 of
    the optimum worse than greedy to 0.009, the mean from 1.061 to 1.060).

    Why: greedy spends its whole slack waiting early and then must finish on on-demand however
    much spot comes back; the offline optimum spreads its on-demand hours into the gaps instead
    and keeps using spot until the end. A reserve of slack buys that flexibility: at most 3 h
    and half the initial slack, and a quarter of the work left, since a return to spot can only
    save work that is left, while a reserve kept too long turns waits greedy would have sat
    out into on-demand hours. Tuned with bench/deadline.py against the optimum.
    """

    name = "adaptive"
    reserve_hours = 3.0  #: slack kept back for leaving on-demand when spot returns, at most
    reserve_of_work = 0.25  #: … and at most this share of the work left
    patience_minutes = 15.0  #: spot must have been up this long to leave on-demand for it
    patience_after_loss = 2.0  #: × the patience, once a return to spot is lost before it works
    prior_spot_share = 0.5  #: spot share assumed before any history: ~ the traces' overall
    prior_hours = 6.0  #: how many hours of history the prior is worth

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        initial_slack = job.deadline_ticks - job.work_ticks
        self._cap = min(ticks_ceil(self.reserve_hours * 3600, job.gap_seconds), initial_slack // 2)
        self._patience = ticks_ceil(self.patience_minutes * 60, job.gap_seconds)
        self._left_od_at: int | None = None  #: tick of the last launch from on-demand to spot
        self._prior_ticks = self.prior_hours * 3600 / job.gap_seconds
        self._seen = 0
        self._spot_run = 0  #: consecutive ticks up to now with spot capacity
        self._spot_ticks = 0  #: ticks with spot capacity so far
        self._spot_runs = 0  #: runs of spot capacity so far

    def _observe(self, history: Sequence[bool]) -> None:
        for up in history[self._seen :]:
            self._spot_runs += up and not self._spot_run
            self._spot_ticks += up
            self._spot_run = self._spot_run + 1 if up else 0
        self._seen = len(history)

    def _reserve(self, s: Slack) -> int:
        """Slack to keep for round trips to spot: none (greedy) when spot looks ample."""
        job = self.job
        usable = self._spot_ticks - job.overhead_ticks * self._spot_runs
        share = (usable + self.prior_spot_share * self._prior_ticks) / (
            self._seen + self._prior_ticks
        )
        floor = 2 * job.overhead_ticks + 1
        if share * (s.time_left - 1) >= s.work_left:
            return floor
        return max(floor, min(self._cap, int(self.reserve_of_work * s.work_left)))

    def decide(self, obs: Observation) -> Mode:
        mode = self._decide(obs)
        if mode is Mode.SPOT and obs.mode is Mode.ON_DEMAND:
            self._left_od_at = obs.tick
        return mode

    def _decide(self, obs: Observation) -> Mode:
        job = self.job
        self._observe(obs.history)
        if self._left_od_at is not None and obs.mode is not Mode.SPOT:
            if obs.mode is Mode.NONE and obs.tick - self._left_od_at < job.overhead_ticks:
                base = ticks_ceil(self.patience_minutes * 60, job.gap_seconds)
                self._patience = int(self.patience_after_loss * base)  # a lost bet
            self._left_od_at = None
        if obs.spot_now:
            if obs.mode is Mode.SPOT and safe(job, obs, Mode.SPOT):
                return Mode.SPOT
            if obs.mode is Mode.NONE and _spot_entry_ok(job, obs):
                return Mode.SPOT
            lasting = self._spot_run >= self._patience
            if obs.mode is Mode.ON_DEMAND and lasting and _spot_entry_ok(job, obs):
                return Mode.SPOT
        if obs.mode is Mode.ON_DEMAND or not safe(job, obs, Mode.NONE):
            return Mode.ON_DEMAND
        s = Slack.of(job, obs)
        return Mode.NONE if s.slack > self._reserve(s) else Mode.ON_DEMAND


def decision_reason(choice: Mode, obs: Observation, slack: Slack, gap_s: int) -> str:
    """Why the policy's answer, in words a user reads in `status` and the run record."""
    hours = slack.slack * gap_s / 3600
    spot = "spot capacity is there" if obs.spot_now else "no spot capacity"
    if choice is Mode.ON_DEMAND:
        return f"{spot}; slack {hours:.2f} h must cover one restart and the work left"
    if choice is Mode.SPOT:
        return f"{spot}; slack {hours:.2f} h allows spot"
    return f"{spot}; waiting while the slack ({hours:.2f} h) allows it"
