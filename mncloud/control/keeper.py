"""Keeps a local deadline controller alive: `python -m mncloud.control.keeper NAME`.

`up --deadline` (and `mncloud status`, `up --resume` for a controller found dead) starts this
small process, detached; it runs the controller (`python -m mncloud control NAME`) as its child
and starts it again when it dies without having ended the run (`kill -9`, an out-of-memory
kill, a crash). The new controller resumes from the state the old one journaled
(`loop.Controller._recover`), so no decision is launched twice. Example:

    t=0     keeper (pid 100) starts the controller (pid 101); it launches spot at tick 0
    t=40    `kill -9 101`: the kernel releases the controller lock
    t=41    the keeper starts pid 102; it takes the lock, reads the state (market spot, the run
            record of tick 0) and goes on deciding from the tick it is at
    t=90    the run finishes: pid 102 exits 0 with the state final; the keeper exits

It stops keeping when the controller exits 0 (the run ended, or another controller holds the
lock), when the state is final, when `mncloud down` wrote its stop request, or after
`MAX_RESTARTS` restarts in a row, each of a controller that lived less than `HEALTHY_S` (a
crash loop: `mncloud status` or `up --resume` starts a new keeper once it is mended; a
controller killed now and then over a week-long run is always restarted). SIGTERM is passed
on to the controller (which stops the run).
On SkyPilot no keeper runs: SkyPilot's jobs controller restarts the controller's managed job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from mncloud import layout
from mncloud.control.state import controller_running, load_state, stop_requested

KEEPER_ENV = "MNCLOUD_CONTROL_KEEPER"
"""Set to the keeper's pid in the controller's environment (it records it in its state)."""
MAX_RESTARTS = 20
HEALTHY_S = 600.0
"""A controller that lived this long was not crash-looping: the restart count starts over."""
RESTART_DELAY_S = 1.0


def restarts_after(restarts: int, lived_s: float) -> int:
    """The crash-loop count after a controller that lived `lived_s` seconds died."""
    return 1 if lived_s >= HEALTHY_S else restarts + 1


def command(name: str) -> list[str]:
    """The keeper's command line (`start.spawn_local` runs it detached)."""
    return [sys.executable, "-m", "mncloud.control.keeper", name]


def keep(name: str) -> int:
    """Run the controller of `name` until it ends the run (see the module docstring)."""
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def forward(*_: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            with contextlib.suppress(OSError):
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    env = dict(os.environ, **{KEEPER_ENV: str(os.getpid())})
    restarts = 0
    while True:
        with open(layout.control_log(name), "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "mncloud", "control", name],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started = time.monotonic()
        code = child.wait()
        restarts = restarts_after(restarts, time.monotonic() - started)
        if stopping or code == 0 or restarts > MAX_RESTARTS or not _keep_going(name):
            return code
        _note(name, f"the controller (pid {child.pid}) died ({_exit(code)}); restarting it "
              f"from its state ({restarts}/{MAX_RESTARTS})")  # fmt: skip
        time.sleep(RESTART_DELAY_S)
        if stopping or not _keep_going(name):
            return code


def _keep_going(name: str) -> bool:
    """The run still needs a controller, and none runs."""
    try:
        state = load_state(name, fresh=False)
    except Exception:
        return False
    return not state.final and stop_requested(name) is None and not controller_running(name)


def _exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def _note(name: str, line: str) -> None:
    with open(layout.control_log(name), "a") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [keeper] {line}\n")


if __name__ == "__main__":
    sys.exit(keep(sys.argv[1]))
