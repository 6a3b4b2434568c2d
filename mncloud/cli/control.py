"""`mncloud control NAME`: the deadline controller of a run (`mncloud.control`), and the
`up --deadline` branch that starts it.

`up --deadline` starts this command detached (a local process, or a CPU SkyPilot managed job);
a user runs it by hand only to take over a controller that died (`status` says so).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mncloud.cli._common import console, handle_errors, print_json
from mncloud.errors import SpecError

if TYPE_CHECKING:
    from mncloud.control import ControlState
    from mncloud.spec import JobSpec, LaunchOptions


def register(app: typer.Typer) -> None:
    """Add `control` to the app."""
    app.command("control")(control_command)


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
    import os

    from mncloud import control

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger("mncloud").addHandler(handler)
    logging.getLogger("mncloud").setLevel(logging.INFO)
    logging.getLogger("mncloud").propagate = False
    if state_uri is not None:
        state = control.load_uri(state_uri)
        if state is None:
            raise SpecError(f"no controller state at {state_uri}")
    else:
        state = control.load_state(name)
    if state.final:
        console.print(f"{name}: already {state.phase}; {state.detail}")
        return
    if workdir is not None:
        state.spec = _rebased(state.spec, workdir.resolve())
    state.pid = os.getpid()
    if state.config.backend == "local":
        state.controller = f"this machine, pid {state.pid}"
    controller = control.Controller(state, _market(state))
    signal.signal(signal.SIGTERM, lambda *_: controller.request_stop())
    final = controller.run()
    console.print(f"{name}: {final.phase}; {final.detail}", highlight=False)


def _market(state: ControlState) -> Any:
    from mncloud import control
    from mncloud.replay import Trace, load_trace

    cfg = state.config
    if cfg.backend != "local":
        return control.ManagedJobMarket()
    if cfg.trace is None:  # no trace: spot is always there
        trace = Trace.model_validate({"metadata": {"gap_seconds": cfg.gap_s}, "data": [cfg.nodes]})
    else:
        trace = load_trace(cfg.trace)
    return control.TraceMarket(trace, cfg.nodes)


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
    values: dict[str, Any],
    *,
    hours_given: bool,
    existing: str,
    dryrun: bool,
    as_json: bool,
) -> None:
    """`up --deadline`: check, then start the controller and say where it runs."""
    from mncloud.cli.options import parse_duration
    from mncloud.control import deadline_state, start

    deadline_s = parse_duration(values["deadline"], "--deadline")
    assert deadline_s is not None
    state = deadline_state(
        spec,
        options,
        deadline_s=deadline_s,
        hours_given=hours_given,
        budget=values.get("budget"),
        spot_trace=values.get("spot_trace"),
        time_scale=values.get("time_scale"),
        spot_price=values.get("spot_price"),
        on_demand_price=values.get("on_demand_price"),
        existing=existing,
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
    if dryrun:
        console.print("dry run: the request is valid; no controller started", highlight=False)
        return
    console.print(
        f"deadline controller started ({state.controller}); follow it with "
        f"`mncloud status {spec.name}`, stop it with `mncloud down {spec.name}`",
        highlight=False,
    )
