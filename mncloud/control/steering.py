"""What the controller's helpers may use of it (`Steering`), and where it steers (`Course`).

`loop.Controller` is one class; what differs between a run in one place and one across
places is a `Course` it is given (`OnePlace` here, `places.PlacesCourse`): how spot capacity
is learned, what the policy chooses, where a launch goes and at what price. The helpers
(`recovery`, `outcomes`, `unsure`, `billing`, `elastic`) name the `Steering` Protocol instead of
importing the loop, so the loop imports them and nothing imports the loop back.
A launch made is one value, `LaunchMade`, so what recording it takes is written once:
`Controller.launched` records it, and a course adds to it through `Course.placed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mncloud.deadline.policy import Mode

if TYPE_CHECKING:
    from mncloud.backends.base import Backend, RunStatus
    from mncloud.control.markets import Clock, Market
    from mncloud.control.state import ControlState, Decision
    from mncloud.deadline.policy import Observation, Policy
    from mncloud.records.ledger import CostSummary
    from mncloud.spec import JobSpec


@dataclass
class LaunchMade:
    """A launch made (or found made, after a crash), as the controller records it: once."""

    mode: Mode
    tick: int
    reason: str
    """The decision's reason, as the run record's `launch` event says it."""
    run_id: str | None
    ckpt_uri: str | None
    placement: dict[str, Any]
    """Where it runs and its price: cloud, region, instance_type, hourly_price."""


class Course(Protocol):
    """Where the controller steers the run: one place (`OnePlace`) or several
    (`places.PlacesCourse`). Each member reads and writes the controller's state `st`."""

    keeps_spot_request: bool
    """Whether a spot launch that lost capacity stays queued (SkyPilot) or is gone (local)."""

    def learn(
        self, st: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> tuple[bool, bool]:
        """Spot capacity up to `tick`: (there for the live launch, there at all)."""
        ...

    def spot_gone(self, st: ControlState, now: float) -> None:
        """The spot launch found no capacity (where it runs): missing from now on."""
        ...

    def offered(
        self, st: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> int | None:
        """How many spot nodes `tick` offers, for an elastic run (`--min-nodes`,
        `elastic.py`); None: not known, all or none as `learn` says."""
        ...

    def lose_spot(self, name: str, backend: Backend) -> None:
        """Spot capacity went away under the running spot launch."""
        ...

    def choose(self, st: ControlState, obs: Observation) -> Mode:
        """The policy's answer (across places it also picks the place, `place_of`)."""
        ...

    def place_of(self, st: ControlState, choice: Mode) -> int | None:
        """Where `choice` runs (None: one place)."""
        ...

    def place_name(self, place: int | None) -> str | None:
        """The name of place `place`, as decisions and reasons say it."""
        ...

    def price(self, st: ControlState, mode: Mode, place: int | None = None) -> float:
        """USD per hour (run time) of the whole run in `mode` (at `place`)."""
        ...

    def pinned(self, st: ControlState, spec: JobSpec, runs_here: bool) -> JobSpec:
        """The spec the journaled launch runs (across places: narrowed to its place)."""
        ...

    def placed(self, st: ControlState, made: LaunchMade, runs_here: bool) -> LaunchMade:
        """Where a launch made runs, before it is recorded (across places: its place)."""
        ...

    def account(self, st: ControlState, costs: dict[str, CostSummary]) -> None:
        """What the course keeps of each launch's ledger beyond the markets' sums."""
        ...


class OnePlace:
    """A run in one place: capacity from its `Market`, the decision from its policy."""

    def __init__(self, market: Market, policy: Policy) -> None:
        self.market, self.policy = market, policy
        self.keeps_spot_request = market.keeps_spot_request

    def learn(
        self, st: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> tuple[bool, bool]:
        while len(st.history) <= tick:
            st.history.append(self.market.spot_at(st, len(st.history), status, now))
        spot_now = st.history[tick]
        if not spot_now:
            st.spot_missing_since = st.spot_missing_since or now
        elif st.market is Mode.SPOT:
            st.spot_missing_since = None
        return spot_now, spot_now

    def spot_gone(self, st: ControlState, now: float) -> None:
        spot_gone_everywhere(st, now)

    def offered(
        self, st: ControlState, tick: int, status: RunStatus | None, now: float
    ) -> int | None:
        return self.market.offered(st, tick, status, now)

    def lose_spot(self, name: str, backend: Backend) -> None:
        self.market.lose_spot(name, backend)

    def choose(self, st: ControlState, obs: Observation) -> Mode:
        return self.policy.decide(obs)

    def place_of(self, st: ControlState, choice: Mode) -> int | None:
        return None

    def place_name(self, place: int | None) -> str | None:
        return None

    def price(self, st: ControlState, mode: Mode, place: int | None = None) -> float:
        return st.config.price(mode)

    def pinned(self, st: ControlState, spec: JobSpec, runs_here: bool) -> JobSpec:
        return spec

    def placed(self, st: ControlState, made: LaunchMade, runs_here: bool) -> LaunchMade:
        return made

    def account(self, st: ControlState, costs: dict[str, CostSummary]) -> None:
        """Nothing beyond the markets' sums."""


def spot_gone_everywhere(st: ControlState, now: float) -> None:
    """No spot capacity anywhere from `now` on (this tick too)."""
    st.spot_missing_since = now
    if st.history:
        st.history[-1] = False


class Steering(Protocol):
    """The controller as its helpers see it: its state, backend, clock and course, and its
    public actions, each journaled in the state before it starts (`loop.Controller` documents
    each). Nothing here is private: a helper uses only these, the rest of the loop is its own."""

    state: ControlState
    backend: Backend
    clock: Clock
    course: Course

    def stop_notice_s(self, budget_left: float | None = None) -> float: ...
    def down(self, notice_s: float) -> None: ...
    def take_down(self, why: str, notice_s: float | None = None) -> None: ...
    def launch(self, mode: Mode, tick: int, reason: str, *, again: bool = False) -> None: ...
    def launched(self, made: LaunchMade) -> None: ...
    def decided(self, decision: Decision) -> None: ...
    def event(self, kind: Any, detail: str, **placement: Any) -> None: ...
    def refresh_costs(self) -> None: ...
    def preempted(self, tick: int) -> None: ...
