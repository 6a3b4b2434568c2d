"""Deadline decisions across K places: spot in one of them, on-demand, or wait.

The multi-place extension of `deadline.policy` (same ticks, same safety net, same `Mode`s). A
*place* is where spot can run: a zone, a region or a cloud, each with its own spot capacity
(one trace each in replay, a market each live) and its own spot price. On-demand is always
there, at one price, in the home place (the first `--region`/`--cloud` given, where the bucket
is). A launch anywhere costs the restart overhead; a launch in a place away from the bucket
also pays the checkpoint's egress (`Place.launch_cost`, at the catalog's $/GB).

Pure, as `policy.py`: a policy sees `PlacesObservation` (the past and present of every place)
and answers a `Choice` (a mode and, for spot, the place). Policies live in their own registry,
`PLACE_POLICIES`, since they answer a place as well as a mode; each wraps the single-place
policy of the same name for the market decision, so a single place decides exactly as before.
Replay and the exact K-place optimum are in `mncloud.deadline.replay_places`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mncloud.deadline.policy import (
    DEFAULT_POLICY,
    POLICIES,
    AdaptivePolicy,
    Job,
    Mode,
    Observation,
    Policy,
    make_policy,
)
from mncloud.errors import SpecError


@dataclass(frozen=True)
class Place:
    """Where spot can run, and what running there costs."""

    name: str
    spot_price: float  #: $ per node-hour
    launch_cost: float = 0.0  #: $ per launch here: the checkpoint's egress from the bucket


@dataclass(frozen=True)
class PlacesJob:
    """A job's constants across places: `job` for time and on-demand, `places` for spot."""

    job: Job
    places: tuple[Place, ...]

    def __post_init__(self) -> None:
        if not self.places:
            raise SpecError("at least one place is needed")
        if any(p.spot_price < 0 or p.launch_cost < 0 for p in self.places):
            raise SpecError("place prices and launch costs must be ≥ 0")

    @property
    def k(self) -> int:
        return len(self.places)

    def spot_tick_cost(self, place: int) -> float:
        """$ for one tick of the whole cluster on spot at `place`."""
        job = self.job
        return job.nodes * self.places[place].spot_price * job.gap_seconds / 3600

    def on_demand_tick_cost(self) -> float:
        return self.job.tick_cost(Mode.ON_DEMAND)


class Choice(NamedTuple):
    """A decision: the mode, and for SPOT the place (an index into `PlacesJob.places`)."""

    mode: Mode
    place: int | None = None


@dataclass(frozen=True)
class PlacesObservation:
    """What a decision may see: every place's past and present, never the future."""

    tick: int
    work_done: int
    mode: Mode  #: NONE after a preemption
    place: int | None  #: where the spot cluster runs (mode SPOT), else None
    overhead_left: int
    spot_now: tuple[bool, ...]  #: per place: spot capacity for all N nodes this tick
    history: Sequence[Sequence[bool]]  #: per tick 0..tick, per place (the last is `spot_now`)

    def single(self) -> Observation:
        """The single-place view: spot anywhere counts as spot."""
        return Observation(
            self.tick,
            self.work_done,
            self.mode,
            self.overhead_left,
            any(self.spot_now),
            _AnyPrefix(self.history),
        )


class PlacesPolicy:
    """Base: the market decision of the single-place policy `name` on "spot anywhere"; the
    place chosen by `pick`. Stays where it runs while spot lasts there (a move costs a
    restart); after a preemption, the single-place policy sees the cluster gone (NONE) and
    says whether to launch spot again, which then happens in another place if one has spot."""

    name = ""

    def __init__(self, pjob: PlacesJob) -> None:
        self.pjob = pjob
        self.market: Policy = make_policy(self.name, pjob.job)

    def decide(self, obs: PlacesObservation) -> Choice:
        mode = self.market.decide(obs.single())
        if mode is not Mode.SPOT:
            return Choice(mode)
        if obs.mode is Mode.SPOT and obs.place is not None and obs.spot_now[obs.place]:
            return Choice(Mode.SPOT, obs.place)
        return Choice(Mode.SPOT, self.pick(obs))

    def pick(self, obs: PlacesObservation) -> int:
        """The place to launch spot in, among those with spot now."""
        up = [p for p, there in enumerate(obs.spot_now) if there]
        return min(up, key=lambda p: (self._launch_price(p), p))

    def _launch_price(self, p: int) -> float:
        """A launch's $ at place p: its overhead at the spot price, plus its egress."""
        pj = self.pjob
        return pj.job.overhead_ticks * pj.spot_tick_cost(p) + pj.places[p].launch_cost


PLACE_POLICIES: dict[str, type[PlacesPolicy]] = {}


def _register(cls: type[PlacesPolicy]) -> type[PlacesPolicy]:
    PLACE_POLICIES[cls.name] = cls
    return cls


def make_places_policy(name: str, pjob: PlacesJob) -> PlacesPolicy:
    """A fresh multi-place policy by name; SpecError naming the choices if unknown."""
    try:
        return PLACE_POLICIES[name](pjob)
    except KeyError:
        names = ", ".join(PLACE_POLICIES)
        raise SpecError(f"unknown policy {name!r} across places; choose one of {names}") from None


@_register
class OnDemandPlaces(PlacesPolicy):
    """On-demand throughout, in the home place: the baseline."""

    name = "on-demand"


@_register
class GreedyPlaces(PlacesPolicy):
    """Greedy over places: spot wherever it is (the cheapest launch among the places with spot,
    the first listed on a tie), else wait; on-demand for good when the safety net fires.

    Events (two zones): spot in a → a preempted, b has spot → launch in b (one restart) → b
    preempted, a and b dry → wait … slack down to one restart → on-demand to the end.
    """

    name = "greedy"


@_register
class UniformProgressPlaces(PlacesPolicy):
    """Uniform Progress (Can't Be Late) on "spot anywhere", greedy's choice of place."""

    name = "uniform-progress"


class _AdaptiveAnywhere(AdaptivePolicy):
    """The adaptive market decision on "spot anywhere": a smaller reserve (see AdaptivePlaces)."""

    reserve_of_work = 0.15


@_register
class AdaptivePlaces(PlacesPolicy):
    """Ours: the adaptive policy's market decision on "spot anywhere", and the place whose
    spot has lasted longest.

    Events (four zones, 10 min restarts): spot in zone a (up 3 h) → a preempted; b came up
    5 min ago, c has been up 6 h → launch in c, not b: spot lifetimes on the traces have a
    decreasing hazard (half the runs die within 20–30 min, the mean run lasts hours), so the
    run that has already lasted is the one likely to last on, and each preemption avoided is
    a restart saved. Prices break the tie the other way round: a place is passed over for an
    older one only while its launch would cost no less (spot $ over the restart and egress).
    With one place this is exactly the single-place adaptive policy.

    The reserve of slack kept for leaving on-demand is at most 15 % of the work left, not
    25 %: with several places spot anywhere comes back sooner, so on-demand taken early in a
    gap is more often paid for nothing (bench/deadline_places.py: 25 % was 0.015 of the
    optimum worse than greedy in a group, 15 % at most 0.001, and cheaper on the mean).

    Why not move a running cluster to a place that looks better: a move costs a restart for
    sure, against a preemption that may not come (tried: moving to the place with the lowest
    preemption rate seen was 0.5–1 % dearer on the traces).
    """

    name = DEFAULT_POLICY

    def __init__(self, pjob: PlacesJob) -> None:
        super().__init__(pjob)
        if pjob.k > 1:
            self.market = _AdaptiveAnywhere(pjob.job)
        self._age = [0] * pjob.k  #: ticks each place's spot has been up, to now
        self._seen = 0

    def decide(self, obs: PlacesObservation) -> Choice:
        for row in obs.history[self._seen :]:
            self._age = [a + 1 if up else 0 for a, up in zip(self._age, row, strict=True)]
        self._seen = len(obs.history)
        return super().decide(obs)

    def pick(self, obs: PlacesObservation) -> int:
        up = [p for p, there in enumerate(obs.spot_now) if there]
        return min(up, key=lambda p: (self._launch_price(p), -self._age[p], p))


assert set(PLACE_POLICIES) == set(POLICIES), "each single-place policy has a multi-place one"


class _AnyPrefix(Sequence[bool]):
    """Spot anywhere, per tick of a per-place history (a view; nothing copied)."""

    def __init__(self, history: Sequence[Sequence[bool]]) -> None:
        self._history = history

    def __len__(self) -> int:
        return len(self._history)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return [any(row) for row in self._history[index]]
        return any(self._history[index])
