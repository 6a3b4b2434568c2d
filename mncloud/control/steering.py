"""`Steering`: what the controller's helpers (`recovery`, `outcomes`, `elastic`) may use of it.

`loop.Controller` (and `places.PlacesController`) provide it; the helpers name this Protocol
instead of importing the loop, so the loop imports them and nothing imports the loop back.
A launch made is one value, `LaunchMade`, so what recording it takes is written once here:
`Controller._launched` records it, and a variant adds to it through `Controller._placed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mncloud.backends.base import Backend
    from mncloud.control.markets import Clock, Market
    from mncloud.control.state import ControlState, Decision
    from mncloud.deadline.policy import Mode


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


class Steering(Protocol):
    """The controller as its helpers see it: its state, backend and clock, and its actions,
    each journaled in the state before it starts (`loop.Controller` documents each)."""

    state: ControlState
    backend: Backend
    clock: Clock
    market: Market

    def stop_notice_s(self, budget_left: float | None = None) -> float: ...
    def _down(self, notice_s: float) -> None: ...
    def _take_down(self, why: str, notice_s: float | None = None) -> None: ...
    def _launch(self, mode: Mode, tick: int, reason: str, *, again: bool = False) -> None: ...
    def _launched(self, made: LaunchMade) -> None: ...
    def _decided(self, decision: Decision) -> None: ...
    def _event(self, kind: Any, detail: str, **placement: Any) -> None: ...
    def _refresh_costs(self) -> None: ...
    def _spot_gone(self, now: float) -> None: ...
    def _checkpoint_step(self) -> int | None: ...
    def _preempted(self, tick: int) -> None: ...
