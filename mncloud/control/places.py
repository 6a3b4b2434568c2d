"""The deadline controller across places: spot wherever it is, on-demand in the home place.

`up --deadline` with several places (`--region` or `--cloud` given more than once on a cloud;
`--spot-trace` given once per place locally) keeps `ControlConfig.places`, and the run is
steered by `loop.Controller` with a `PlacesCourse` (`places_controller`): each tick's capacity
learned per place and the decision made by `deadline.places` (a mode and, for spot, a place).

A spot choice in another place than the live launch's is a *move*: the live launch is taken
down gracefully (a preemption notice, as a market switch is) and the same spec is launched
pinned to the new place (`JobSpec.clouds` / `regions` narrowed to it), resuming from the
newest complete checkpoint. On-demand runs in the home place (the first given). Example, two
regions, capacity gone in the first after an hour:

    tick 0    a, b unknown (count as there) → adaptive: SPOT in a → managed spot job in a
    tick 12   the job in a is RECOVERING → preempted; spot in a missing since now; b has not
              been seen missing → SPOT in b: the job in a is cancelled (journaled `closing`),
              the spec pinned to b is launched (journaled `launching`, place b), RESUME
    tick 24   b runs on; a is probed again only `probe_after_s` after it was seen missing

Capacity per place: locally each place follows its own trace (`TracePlaces`: a place losing
capacity under the running launch preempts it, as `TraceMarket` does); on SkyPilot the place
the spot job runs in is read off the managed job (`ManagedJobMarket`), and every other place
counts as there until it was seen missing, then again `probe_after_s` later
(`ManagedJobPlaces`, `ControlState.place_missing_since`).

Each launch's record gets the controller's `launch` event with that place's cloud, region
and price, and `ControlState.place_costs` sums the ledgers of each place's launches
(`mncloud status` shows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mncloud.control.loop import Controller
from mncloud.control.markets import ManagedJobMarket, TraceMarket
from mncloud.control.state import ControlConfig, ControlState
from mncloud.control.steering import spot_gone_everywhere
from mncloud.deadline.places import Choice, Place, PlacesJob, PlacesObservation, make_places_policy
from mncloud.deadline.policy import Mode, Observation

if TYPE_CHECKING:
    from mncloud.backends.base import Backend, RunStatus
    from mncloud.control.steering import LaunchMade
    from mncloud.plan.traces import Trace
    from mncloud.records.ledger import CostSummary
    from mncloud.spec import JobSpec


def places_job(cfg: ControlConfig) -> PlacesJob:
    """The multi-place policy's view of the job (SpecError when the deadline cannot be met)."""
    places = tuple(Place(p.name, p.spot_price, p.launch_cost) for p in cfg.places)
    return PlacesJob(cfg.job(), places)


class PlacesMarket(Protocol):
    """Spot capacity per place, and how a running spot launch loses it."""

    keeps_spot_request: bool

    def spot_at(
        self, state: ControlState, place: int, tick: int, status: RunStatus | None, now: float
    ) -> bool:
        """Whether spot capacity for all nodes is there at `place` at `tick`."""
        ...

    def lose_spot(self, name: str, backend: Backend) -> None:
        """Spot capacity went away under the running spot launch."""
        ...


class TracePlaces:
    """Local rehearsal: each place's "spot" nodes follow its own trace."""

    keeps_spot_request = False

    def __init__(self, traces: Sequence[Trace], nodes: int) -> None:
        self.markets = [TraceMarket(trace, nodes) for trace in traces]

    def spot_at(
        self, state: ControlState, place: int, tick: int, status: RunStatus | None, now: float
    ) -> bool:
        return self.markets[place].spot_at(state, tick, status, now)

    def lose_spot(self, name: str, backend: Backend) -> None:
        self.markets[0].lose_spot(name, backend)  # the same for every place: SIGKILL, down


class ManagedJobPlaces:
    """SkyPilot: the live spot job's place read off the job, the others by when they were
    last seen missing (see the module docstring)."""

    keeps_spot_request = True

    def __init__(self) -> None:
        self.live = ManagedJobMarket()

    def spot_at(
        self, state: ControlState, place: int, tick: int, status: RunStatus | None, now: float
    ) -> bool:
        cfg = state.config
        live = state.market is Mode.SPOT and status is not None and not status.state.is_final
        if live and place == state.place:
            return self.live.spot_at(state, tick, status, now)
        missing = state.place_missing_since[place]
        return missing is None or (now - missing) * cfg.time_scale >= cfg.probe_after_s

    def lose_spot(self, name: str, backend: Backend) -> None:
        """Nothing to stop: SkyPilot keeps looking for spot VMs in the place."""


def places_market(state: ControlState) -> PlacesMarket:
    """The capacity source of a multi-place run (a trace per place locally)."""
    cfg = state.config
    from mncloud.backends.registry import get_backend

    if not get_backend(cfg.backend).runs_here:
        return ManagedJobPlaces()
    from mncloud.plan.traces import Trace, load_trace

    always = Trace.model_validate({"metadata": {"gap_seconds": cfg.gap_s}, "data": [cfg.nodes]})
    traces = [load_trace(p.trace) if p.trace else always for p in cfg.places]
    return TracePlaces(traces, cfg.nodes)


def places_controller(state: ControlState, market: PlacesMarket, **kw: Any) -> Controller:
    """The `Controller` steering across places (see the module docstring); `kw` as its."""
    return Controller(state, course=PlacesCourse(state, market), **kw)


class PlacesCourse:
    """The controller's `Course` across several places (see the module docstring)."""

    def __init__(self, state: ControlState, market: PlacesMarket) -> None:
        self.places = state.config.places
        self.market = market
        self.keeps_spot_request = market.keeps_spot_request
        self.policy = make_places_policy(state.config.policy, places_job(state.config))
        self.target: int | None = None
        """The place of the policy's last spot choice."""
        if len(state.place_missing_since) != len(self.places):
            state.place_missing_since = [None] * len(self.places)

    # ------------------------------------------------------------- capacity
    def learn(
        self, st: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> tuple[bool, bool]:
        market = self.market
        while len(st.place_history) <= tick:
            at = len(st.place_history)
            row = [market.spot_at(st, p, at, status, now) for p in range(len(self.places))]
            st.place_history.append(row)
            st.history.append(any(row))  # "spot anywhere", as status and the ui read it
        row = st.place_history[tick]
        live_spot = st.market is Mode.SPOT and st.place is not None
        for p, up in enumerate(row):
            if not up:
                st.place_missing_since[p] = st.place_missing_since[p] or now
            elif live_spot and p == st.place:
                st.place_missing_since[p] = None
        if not any(row):
            st.spot_missing_since = st.spot_missing_since or now
        elif live_spot:
            st.spot_missing_since = None
        here = row[st.place] if live_spot and st.place is not None else any(row)
        return here, any(row)

    def offered(
        self, st: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> int | None:
        """Not known: an elastic run across places is refused (`--min-nodes`)."""
        return None

    def spot_gone(self, st: ControlState, now: float) -> None:
        """The spot launch found no capacity in its place: missing there from now on."""
        place = st.place
        if place is not None:
            st.place_missing_since[place] = now
            if st.place_history:
                st.place_history[-1][place] = False
                st.history[-1] = any(st.place_history[-1])
        if not st.place_history or not any(st.place_history[-1]):
            spot_gone_everywhere(st, now)

    def lose_spot(self, name: str, backend: Backend) -> None:
        self.market.lose_spot(name, backend)

    # ------------------------------------------------------------- decision
    def choose(self, st: ControlState, obs: Observation) -> Mode:
        place = st.place if obs.mode is Mode.SPOT else None
        row = tuple(st.place_history[obs.tick])
        seen = PlacesObservation(obs.tick, obs.work_done, obs.mode, place, obs.overhead_left,
                                 row, st.place_history)  # fmt: skip
        choice: Choice = self.policy.decide(seen)
        self.target = choice.place
        return choice.mode

    def place_of(self, st: ControlState, choice: Mode) -> int | None:
        if choice is Mode.SPOT:
            if self.target is not None:
                return self.target
            return st.place if st.place is not None else 0
        return 0 if choice is Mode.ON_DEMAND else None

    def place_name(self, place: int | None) -> str | None:
        return self.places[place].name if place is not None else None

    def price(self, st: ControlState, mode: Mode, place: int | None = None) -> float:
        if place is None:
            place = st.launching.place if st.launching is not None else st.place
        if mode is Mode.SPOT and place is not None:
            return st.config.nodes * self.places[place].spot_price
        return st.config.price(mode)

    # -------------------------------------------------------------- actions
    def pinned(self, st: ControlState, spec: JobSpec, runs_here: bool) -> JobSpec:
        """The spec narrowed to the launch's place (a cloud's; local places share the host)."""
        place = st.launching.place if st.launching is not None else None
        if runs_here or place is None:
            return spec
        p = self.places[place]
        update: dict[str, Any] = {}
        if p.cloud:
            update["clouds"] = [p.cloud]
        if p.region:
            update["regions"] = [p.region]
        return spec.updated(**update)

    def placed(self, st: ControlState, made: LaunchMade, runs_here: bool) -> LaunchMade:
        """The place the launch runs in: kept in the state, named in its reason."""
        mode = made.mode
        pending = st.launching
        place = pending.place if pending is not None else None
        if place is None:
            place = self.place_of(st, mode)
        if place is not None:
            p = self.places[place]
            if runs_here:  # places on this machine share it: name it
                made.placement["region"] = p.name
            if mode is Mode.SPOT and st.last_launch is Mode.SPOT and st.place not in (None, place):
                st.moves += 1
            st.place = place
            if made.run_id:
                st.run_places[made.run_id] = p.name
            made.reason = f"{made.reason} (in {p.name})"
        return made

    def account(self, st: ControlState, costs: dict[str, CostSummary]) -> None:
        """Each place's cost so far: its launches' ledgers."""
        by_place: dict[str, float] = {p.name: 0.0 for p in self.places}
        for run_id, summary in costs.items():
            name = st.run_places.get(run_id, self.places[0].name)
            by_place[name] = by_place.get(name, 0.0) + summary.total
        st.place_costs = by_place
