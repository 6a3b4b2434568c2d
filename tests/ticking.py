"""The deadline controller's looks on a test clock, one helper for every controller test.

`ticker(ctl, state, clock)` gives `tick(n)`: `n` looks `gap` seconds apart, as `Controller.run`
makes them (one `step`, the state saved, then the clock moved on), never a real sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mncloud import control
from tests.test_control import GAP, FakeClock


def ticker(
    ctl: Any, state: control.ControlState, clock: FakeClock, gap: float = GAP
) -> Callable[..., None]:
    """A `tick(n=1)` that steps `ctl` `n` times, saving `state` and moving `clock` by `gap`."""

    def tick(n: int = 1) -> None:
        for _ in range(n):
            ctl.step()
            control.save_state(state)
            clock.now += gap

    return tick
