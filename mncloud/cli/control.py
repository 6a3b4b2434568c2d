"""`mncloud control NAME`: the deadline controller of a run (`mncloud.control`), and the
`up --deadline` branch that starts it.

`up --deadline` starts this command detached (locally under its keeper,
`mncloud.control.keeper`, which restarts it if it dies; on SkyPilot as a CPU managed job,
which SkyPilot restarts). A controller started on a state another one left resumes it
(`Controller.run`); one started while another holds the run's controller lock exits at once.

Its exit status is what SkyPilot's `job_recovery.max_restarts_on_errors` (and the keeper)
go by, so it says whether the controller is done:

- 0: done, on purpose: the run finished, failed (a refused launch, a backend gone: the
  controller recorded it as final), was stopped by `mncloud down` (SIGTERM, or a stop request
  found at start) or hit its budget; or there was nothing to do (the state already final,
  another controller holds the run). Nothing restarts it; a restart would only read the
  final state and exit 0 again.
- `CRASHED` (1): an unexpected exception (a bug); the traceback is logged and the state in
  the run folder and the bucket is left as it was, for a restarted controller to resume.
- 2: an `MncloudError` before the loop ran (its state unreadable or missing, a bucket
  unreachable): one line, and a restart may succeed.
- killed by a signal (an out-of-memory kill): not 0 either. Every status but 0 is restarted.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mncloud.cli._common import console, handle_errors, print_json
from mncloud.errors import MncloudError, SpecError

#: How long a starting controller waits for the run's controller lock (one dying frees it).
LOCK_WAIT_S = 3.0
#: The exit status of a controller that crashed (an unexpected exception): not 0, so SkyPilot
#: (`max_restarts_on_errors`) and the local keeper restart it.
CRASHED = 1

log = logging.getLogger("mncloud.control")

if TYPE_CHECKING:
    from mncloud.control import ControlState
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import DeadlineOptions, LaunchOptions


def register(app: typer.Typer) -> None:
    """Add `control` to the app, hidden from its help: `up --deadline` starts it
    (`python -m mncloud control NAME`), a user never does."""
    app.command("control", hidden=True)(control_command)


@handle_errors
def control_command(
    name: Annotated[str, typer.Argument(help="The run name (started with up --deadline).")],
    state_uri: Annotated[
        str | None,
        typer.Option("--state-uri", help="Read the controller's state from this bucket URL."),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="The run's project folder here (a controller VM)."),
    ] = None,
) -> None:
    """Steer a deadline run between spot and on-demand until it ends (started by up)."""
    with _logging_to_stderr(), _own_sigterm():
        _control(name, state_uri, workdir)


@contextlib.contextmanager
def _logging_to_stderr() -> Iterator[None]:
    """mncloud's log on stderr (the controller's log file) while the command runs; the logger
    as it was afterwards (the command also runs in-process, under tests)."""
    logger = logging.getLogger("mncloud")
    saved = logger.level, logger.propagate
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate = saved


@contextlib.contextmanager
def _own_sigterm() -> Iterator[None]:
    """SIGTERM's handler as it was, once the command is over."""
    saved = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


def _control(name: str, state_uri: str | None, workdir: Path | None) -> None:
    import os

    from mncloud import control
    from mncloud.control.keeper import KEEPER_ENV
    from mncloud.control.start import runs_here

    if state_uri is not None:
        state = control.load_uri(state_uri)
        if state is None:
            raise SpecError(f"no controller state at {state_uri}")
    else:
        state = control.load_state(name)
    if state.final:
        console.print(f"{name}: already {state.phase}; {state.detail}", markup=False)
        return
    if runs_here(state):
        lock = control.hold_lock(name, wait=LOCK_WAIT_S)  # held until this process ends
        if lock is None:
            console.print(f"{name}: another controller of the run is running; nothing to do")
            return
        state = control.load_state(name)  # the newest, now that no other controller writes it
        if state.final:
            console.print(f"{name}: already {state.phase}; {state.detail}", markup=False)
            return
        keeper = os.environ.get(KEEPER_ENV)
        state.keeper_pid = int(keeper) if keeper and keeper.isdigit() else None
    if workdir is not None:
        state.spec = _rebased(state.spec, workdir.resolve())
    if state.started_at is not None:  # a controller before this one ran (and died)
        state.resumes += 1
    state.pid = os.getpid()
    if runs_here(state):
        state.controller = f"this machine, pid {state.pid}"
        if state.resumes:
            state.controller += f" (restarted {state.resumes}×)"
    controller = _controller(state)
    signal.signal(signal.SIGTERM, lambda *_: controller.request_stop())
    if control.stop_requested(name) is not None:  # `down` came while no controller ran
        controller.request_stop()
    try:
        final = controller.run()
    except MncloudError:
        raise  # one line, exit 2 (not 0: restarted)
    except Exception:
        log.exception(
            "%s: the deadline controller crashed; its state is kept and a restarted "
            "controller resumes from it",
            name,
        )
        raise typer.Exit(code=CRASHED) from None
    if getattr(controller, "succeeded", False):  # exit 0: the run is another's (`handoff.py`)
        console.print(f"{name}: steered by {final.controller}", highlight=False, soft_wrap=True)
        return
    console.print(f"{name}: {final.phase}; {final.detail}", highlight=False, soft_wrap=True)


def _controller(state: ControlState) -> Any:
    """The controller of the run: across places when its config has several."""
    from mncloud import control

    if state.config.places:
        from mncloud.control.places import places_controller, places_market

        return places_controller(state, places_market(state))
    return control.Controller(state, _market(state))


def _market(state: ControlState) -> Any:
    from mncloud import control
    from mncloud.control.start import runs_here
    from mncloud.plan.traces import Trace, load_trace

    cfg = state.config
    if not runs_here(state):
        return control.ManagedJobMarket()
    if cfg.trace is None:  # no trace: spot is always there
        trace = Trace.model_validate({"metadata": {"gap_seconds": cfg.gap_s}, "data": [cfg.nodes]})
    else:
        trace = load_trace(cfg.trace)
    return control.TraceMarket(trace, cfg.nodes, cfg.min_nodes)


def _rebased(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """The spec with its project folder moved to `workdir` (SkyPilot synced it there)."""
    old = Path(spec["workdir"])
    script = Path(spec["script"])
    moved = dict(spec, workdir=str(workdir))
    if script.is_relative_to(old):
        moved["script"] = str(workdir / script.relative_to(old))
    return moved


def start_deadline_run(
    spec: JobSpec,
    options: LaunchOptions,
    *,
    deadline_s: float,
    numbers: DeadlineOptions,
    spot_prices: list[float],
    spot_traces: list[Path],
    hours_given: bool,
    existing: str,
    dryrun: bool,
    as_json: bool,
) -> None:
    """`up --deadline`: check, then start the controller and say where it runs."""
    from mncloud.control import deadline_state, start

    state = deadline_state(
        spec,
        options,
        deadline_s=deadline_s,
        hours_given=hours_given,
        spot_trace=spot_traces,
        existing=existing,
        **{**numbers.model_dump(), "spot_price": spot_prices or None},
    )
    if not dryrun:
        state = start(state)
    if as_json:
        print_json(state.model_dump(mode="json", include={"name", "config", "controller"}))
        return
    cfg = state.config
    scale = f", time ×{cfg.time_scale:g}" if cfg.time_scale != 1 else ""
    budget = f", budget ${cfg.budget:,.2f}" if cfg.budget is not None else ""
    console.print(
        f"[bold]{spec.name}[/]: {cfg.hours:g} h of work by a {cfg.deadline_s / 3600:g} h deadline"
        f" on {cfg.nodes} node(s): spot ${cfg.spot_price:g}, on-demand ${cfg.on_demand_price:g}"
        f" per node-hour{budget}{scale}",
        highlight=False,
    )
    if cfg.places:
        where = ", ".join(f"{p.name} (spot ${p.spot_price:g})" for p in cfg.places)
        console.print(f"spot in any of {where}; on-demand in {cfg.places[0].name}", highlight=False)
    if dryrun:
        console.print("dry run: the request is valid; no controller started", highlight=False)
        return
    console.print(
        f"deadline controller started ({state.controller}); follow it with "
        f"`mncloud status {spec.name}`, stop it with `mncloud down {spec.name}`",
        highlight=False,
        soft_wrap=True,
    )
