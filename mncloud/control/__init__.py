"""The deadline controller: a loop over `launch.py`, `policy.py` and a backend's status.

`mncloud up … --deadline 30h --hours 20 [--budget 900]` does not launch the run itself: it
checks the request, writes the controller's state and starts `mncloud control NAME`, which
decides every tick (the policy's `Job.gap_seconds` of run time) whether the run should be on
spot, on on-demand, or wait, and makes the run obey: on a switch it stops the current launch
(`down`) and launches the same spec in the other market through `launch.launch(...,
existing=Existing.RESUME)`, so training resumes from the newest complete checkpoint.

    state.py    ControlConfig (the job's constants), ControlState (mode, history, records,
                progress, slack, cost), saved in the run folder and beside the checkpoints
    markets.py  where spot capacity is learned: a time-compressed trace (local rehearsal) or
                the managed job's state (SkyPilot); the injectable clock
    loop.py     Controller: measure, decide, switch, stop at the budget (gracefully), resume
                a journaled action after a crash; where it steers is a `Course` it is given
    start.py    `up --deadline`: bad input refused, the controller started (a local process,
                or a CPU managed job on SkyPilot); `stop` for `down`; `revive` a dead one
    recovery.py a restarted controller finishes the action its state journaled, once
    keeper.py   locally, the process that restarts a controller that died
    identity.py who the live launch is, kept in the state (a restarted controller finds it)
    outcomes.py how the controller answers a launch that ended without it
    progress.py the run's progress as the controller measures it (newest complete step)
    pacing.py   run time; a local rehearsal's paced by its training (`--pace-steps`)
    steering.py what the controller's helpers (`recovery`, `outcomes`) may use of it, and
                `Course`: one place (`OnePlace`) or several (`places.PlacesCourse`)
    down.py     `down` of a cloud deadline run: its controller's job and every training job
    placing.py  `up --deadline` across places: the places a request names, checked and priced
    places.py   the course across places: spot anywhere, on-demand in the home place
    unsure.py   an error in a tick is "unsure, look again" (bounded backoff), not the end
    lease.py    one controller per cloud run: SkyPilot's queue is the lease
    billing.py  the live launch's ledger follows SkyPilot's queue times (waiting unbilled); a
                launch no controller looks at again is closed at SkyPilot's end
    watch.py    `status` of a cloud deadline run asks SkyPilot how its controller is
    access.py   what the controller VM launches with: secrets as SkyPilot secrets
    handoff.py  the run handed to a fresh controller job (a fresh token) before the token expires
    horizon.py  the controller's API token: the run stopped at a checkpoint before it expires
    elastic.py  `--min-nodes`: a spot launch on the nodes spot offers, grown back at the next
                checkpoint

Every launch writes its own run record; each switch is a `launch` event there with its
reason, spot flag and price, so the ledgers of the launches split spot and on-demand.
"""

from mncloud.control.loop import Controller
from mncloud.control.markets import Clock, ManagedJobMarket, SystemClock, TraceMarket
from mncloud.control.start import deadline_state, revive, start, stop
from mncloud.control.state import (
    ControlConfig,
    ControlState,
    controlled_runs,
    controller_running,
    hold_lock,
    load_state,
    load_uri,
    save_state,
    stop_requested,
)

__all__ = [
    "Clock",
    "ControlConfig",
    "ControlState",
    "Controller",
    "ManagedJobMarket",
    "SystemClock",
    "TraceMarket",
    "controlled_runs",
    "controller_running",
    "deadline_state",
    "hold_lock",
    "load_state",
    "load_uri",
    "revive",
    "save_state",
    "start",
    "stop",
    "stop_requested",
]
