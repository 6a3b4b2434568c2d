"""The deadline controller's looks on a test clock, one helper for every controller test.

`ticker(ctl, state, clock)` gives `tick(n)`: `n` looks `gap` seconds apart, as `Controller.run`
makes them (one `step`, the state saved, then the clock moved on), never a real sleep.
`NoticeTime`: the clock the `fake_sky` fixture gives the stop notice a take-down sends to its
faked nodes, so that notice passes without a wall-clock wait.
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


class NoticeTime:
    """A clock for the stop notice's wait (`backends/skypilot/notice.py`) where the nodes are
    faked: nothing can answer the notice, so its wait passes at once, look by look (the same
    looks at the bucket and the job's state as on wall time), and the test's own clock stays
    where the test put it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
