"""The controller's API token is its horizon: the run is handed off, or stopped, before it.

Where SkyPilot's API server has service accounts, SkyPilot gives the controller's job a token
of the launching user valid `CONTROLLER_TOKEN_DAYS` (`access.py`), never renewed while the job
runs. Past its expiry every call of the controller is a 401 (`ApiServerAuthenticationError`
on the client): no look, no budget stop, not even the cancel of its give-up. So the controller
reads the token's expiry (the JWT's `exp` claim, `access.token_expiry`) and hands the run to a
fresh controller job (a fresh token) `HANDOFF_MARGIN_S` before its stop point (`handoff.py`).
The stop point stays as the fallback: `TOKEN_MARGIN_S` before the expiry, a run not handed
off is stopped as `mncloud down` would: a preemption notice (every rank saves the step it
reached), the training job cancelled, checkpoints kept, the reason in the state:

    h 0      up --deadline 100h --hours 90: controller job 1 launched, token until h 72
    h 65     job 1 launches job 5 (token until h 137), which waits for the run
    h 65+    job 5 RUNNING: the run is handed to it, job 1 exits 0; job 5 adopts the
             training job and steers; at h 130 it hands off to job 9, and so on
    (or)     no successor running by h 71 (= 72 h − TOKEN_MARGIN_S): stop (notice, cancel;
             a successor still pending cancelled); phase `stopped`, detail "the controller's
             SkyPilot API token expires …, and the hand-off to a fresh controller job
             failed (…); newest complete checkpoint step N kept"; exit 0
    later    `mncloud up --deadline … --resume`: a new controller job, a new token, on
             from step N

Where the controller carries the laptop's own token (no service accounts, an older server),
a successor would carry the same one: no hand-off (`ControlConfig.hands_off`), the stop
only, and `up` refuses a deadline past it (`access.check_token_life`).

Why not renew: SkyPilot 0.14.1 can rotate a token its creator owns
(`POST /users/service-account-tokens/rotate`, `sky/users/server.py`), and the controller is
that creator; but rotation replaces the token's hash on the server, so the copy SkyPilot keeps
in the controller task's secret dies with it, and a controller SkyPilot restarts (a crash, a
lost VM: `CONTROL_MAX_RESTARTS`) would start blind. A controller that starts already past its
token's expiry (restarted late) makes no call: it says what may still run and how to stop it
(`mncloud down`, from the laptop's own login).
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Protocol

from mncloud.control.access import TOKEN_MARGIN_S, token_expiry
from mncloud.deadline.policy import Mode

if TYPE_CHECKING:
    from mncloud.backends.base import Backend
    from mncloud.control.handoff import Handing
    from mncloud.control.markets import Clock
    from mncloud.control.state import ControlState


class Horizon(Protocol):
    """The controller as this module sees it."""

    state: ControlState
    clock: Clock
    token_ends: float | None


def token_ends(backend: Backend) -> float | None:
    """When the SkyPilot API token this controller calls with expires (epoch seconds); None
    for a controller that calls no API server with a token (a local backend, no token, a
    token that never expires)."""
    ends = token_expiry(os.environ)
    return None if ends is None or backend.runs_here else ends


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def token_stop(ctl: Handing) -> str | None:
    """Why the run stops now, when the token expires within `TOKEN_MARGIN_S` and the run was
    not handed to a fresh controller (`handoff.py`); else None."""
    from mncloud.control.handoff import missed

    ends = ctl.token_ends
    if ends is None or ctl.clock.time() < ends - TOKEN_MARGIN_S:
        return None
    return (
        f"the controller's SkyPilot API token expires at {_when(ends)} and SkyPilot does not "
        f"renew it, and {missed(ctl)}: stopped before it expires, so the training job never "
        "runs unsteered; "
        f"continue with `mncloud up --deadline ... --resume --name {ctl.state.name}`"
    )


def blind(ctl: Horizon) -> bool:
    """Whether the token has already expired (every SkyPilot call would be refused, a 401):
    then the controller makes none, and ends, its state saying what may still run."""
    from mncloud.control.state import save_state

    ends, st = ctl.token_ends, ctl.state
    if ends is None or ctl.clock.time() < ends:
        return False
    if st.final:  # stopped in time (`token_stop`): nothing to add
        return True
    live = st.market is not Mode.NONE or st.launching is not None
    left = (
        f"; its training job may still run: `mncloud down {st.name}` from your laptop stops it"
        if live
        else ""
    )
    st.phase = "failed"  # the live launch stays named in the state, for `mncloud down`
    st.detail = (
        f"controller stopped: its SkyPilot API token expired at {_when(ends)} before it could "
        f"steer again{left}; continue with `mncloud up --deadline ... --resume --name {st.name}`"
    )
    save_state(st)
    return True
