"""An error in a tick is "unsure, look again", not the end of the run.

A deadline controller talks to SkyPilot's API server every look; an API blip, a lost answer,
a 401 while a token is renewed, or a cancel SkyPilot confirms after `cancel.WAIT_S` (tearing
down 4 GPU VMs can take longer) each raise a `BackendError`. Ending the run as `failed` on the
first one left the job it had launched training unsteered (no budget, no switch). So:

    look 1   BackendError: unsure (1 of UNSURE_LOOKS); look again after BACKOFF (5 s, 10 s, …)
    look 2   the journal (`launching` / `closing`) is finished first (`recovery.py`): a
             launch made is adopted, a take-down is done again, then the journaled launch
             (the on-demand launch of a switch whose cancel came late) is made
    look 3   fine: the count starts again
    …
    look N   still failing after UNSURE_LOOKS looks: the run fails, with what it launched
             cancelled (or named, if even that cannot be done)

Only refusals are final at once: a spec, plan or render SkyPilot will never accept
(`REFUSALS`), and SkyPilot's own FAILED_PRECHECKS.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tenacity import RetryCallState, wait_exponential

from mncloud.control.steering import Steering
from mncloud.deadline.policy import Mode
from mncloud.errors import CatalogError, MncloudError, RenderError, SpecError


class Looking(Steering, Protocol):
    """The controller as this module sees it: `Steering` and its count of unsure looks."""

    unsure: int


log = logging.getLogger(__name__)

UNSURE_LOOKS = 8
"""Consecutive looks that end in an error before the run fails."""
BACKOFF = wait_exponential(multiplier=5.0, min=5.0, max=300.0)
"""Wall seconds before the next look after the n-th unsure one (5 s doubling to 5 min)."""
REFUSALS: tuple[type[MncloudError], ...] = (SpecError, CatalogError, RenderError)


def is_refusal(err: MncloudError) -> bool:
    """An error no second look changes."""
    return isinstance(err, REFUSALS) or "FAILED_PRECHECKS" in str(err)


def backoff_s(unsure: int) -> float:
    """The pause before the next look after `unsure` consecutive unsure looks."""
    if unsure <= 0:
        return 0.0
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = unsure
    return float(BACKOFF(state))


def on_tick_error(ctl: Looking, err: MncloudError) -> None:
    """Answer an error raised by one look (see the module docstring)."""
    st = ctl.state
    ctl.unsure += 1
    if not is_refusal(err) and ctl.unsure <= UNSURE_LOOKS:
        st.detail = f"unsure, looking again ({ctl.unsure} of {UNSURE_LOOKS}): {err}"
        log.warning("%s", st.detail)
        return
    why = "refused" if is_refusal(err) else f"{UNSURE_LOOKS} looks in a row failed"
    left = _cancel_launched(ctl)
    st.phase, st.market, st.mode = "failed", Mode.NONE, Mode.NONE
    st.detail = f"controller stopped ({why}): {err}{left}"
    log.error("%s", st.detail)


def _cancel_launched(ctl: Looking) -> str:
    """Cancel what the controller launched before it gives up; what is left to say."""
    st = ctl.state
    if st.market is Mode.NONE and st.launching is None:
        return ""
    try:
        ctl.backend.down(st.name, notice_s=0.0, by="the deadline controller (giving up)")
    except MncloudError as err:
        return f"; its launch may still be live, `mncloud down {st.name}` stops it ({err})"
    st.launching = st.closing = None
    return "; its launch was cancelled, checkpoints kept"
