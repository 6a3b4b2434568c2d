"""`up --deadline`: check the request, write the controller's state, start the controller.

Everything a user can get wrong is checked here, before anything runs (one line, exit 2):
`--spot-trace` or `--time-scale` off the local backend, a time scale ≤ 0, a missing or
malformed trace, a deadline the work cannot meet, a cloud run without a bucket (its
controller keeps its state there), a budget below what the run name has already cost.

Where the controller runs:
- **local**: a detached process on this machine (`python -m mncloud control NAME`, its own
  session, output in `layout.control_log`), like the local supervisor, kept alive by a small
  keeper (`keeper.py`) that restarts it from its journaled state if it dies; `mncloud status`
  and `up --resume` restart one found dead (`revive`).
- **SkyPilot**: a small CPU on-demand *managed job* (`templates/control.yaml.j2`, launched
  with SkyPilot's SDK as `<name>-control`), so it survives the laptop closing and SkyPilot's
  jobs controller restarts it if its VM fails, or if its process dies with a non-zero exit
  status (`job_recovery`: FAILOVER, so on its own VM first, and `max_restarts_on_errors`,
  `CONTROL_MAX_RESTARTS` times at most; it exits 0 only when the run is over or stopped, see
  `mncloud.cli.control`). A restart anywhere launches nothing twice: the state names the
  live launch (`identity.py`). It reads its
  state from the bucket (`layout.control_state_uri`), launches the training job through the
  same API server (which must therefore be reachable from the cloud: a remote one, `sky api
  login`), and writes its state back there, where `mncloud status` on the laptop reads it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mncloud import layout
from mncloud.constants import LOCAL_ON_DEMAND_PRICE, LOCAL_SPOT_PRICE
from mncloud.control.access import (
    ControllerAccess,
    check_identity,
    check_token_life,
    controller_access,
    gets_skypilots_token,
    on_this_machine_only,
    redact_url,
)
from mncloud.control.placing import cloud_places, home_on_demand_price, local_places, per_place
from mncloud.control.state import (
    ControlConfig,
    ControlState,
    PlaceConfig,
    clear_stop_request,
    controller_running,
    load_state,
    request_stop,
    save_state,
    stop_requested,
)
from mncloud.deadline.policy import DEFAULT_POLICY
from mncloud.errors import AnswerLost, BackendError, MncloudError, SpecError
from mncloud.spec import DEFAULT_RECOVERY_MINUTES

if TYPE_CHECKING:
    from mncloud.backends.base import ControllerHost
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import LaunchOptions

#: Clouds: one decision every 5 minutes of run time.
DECISION_INTERVAL_S = 300
CONTROL_TEMPLATE = "control.yaml.j2"
#: SkyPilot restarts of the cloud controller after its process crashed, over the job's life
#: (its `job_recovery.max_restarts_on_errors`; restarts after a VM failure are not counted):
#: sporadic crashes over a run of days are survived, a crash at every start is not retried
#: for ever. Each restart resumes from the state in the bucket.
CONTROL_MAX_RESTARTS = 10
#: SkyPilot's recovery strategy for the controller's job: a crashed controller is restarted on
#: its own VM first (its files intact), a lost VM replaced anywhere; the state in the bucket
#: names the live launch, so neither launches twice (see `templates/control.yaml.j2`).
CONTROL_RECOVERY = "FAILOVER"


def deadline_state(
    spec: JobSpec,
    options: LaunchOptions,
    *,
    deadline_s: float,
    hours_given: bool,
    budget: float | None = None,
    spot_trace: Path | Sequence[Path] | None = None,
    time_scale: float | None = None,
    pace_steps: int | None = None,
    spot_price: float | Sequence[float] | None = None,
    on_demand_price: float | None = None,
    existing: str = "refuse",
    policy: str = DEFAULT_POLICY,
) -> ControlState:
    """The controller's first state for `up --deadline`; SpecError on bad input.

    Several traces (local), or several `--region` / `--cloud` choices (clouds), are several
    places (`control/placing.py`); `spot_price` is then given once or once per place."""
    from mncloud.launch import backend_name

    traces, prices = _listed(spot_trace), [float(p) for p in _listed(spot_price)]
    first_trace = traces[0] if traces else None
    _check_flags(spec, hours_given=hours_given, spot_trace=first_trace, time_scale=time_scale,
                 pace_steps=pace_steps)  # fmt: skip
    if pace_steps is not None and budget is not None:
        raise SpecError(
            "--budget with --pace-steps: a paced rehearsal's ticks wait for the training while "
            "its ledger bills wall time; rehearse a budget without --pace-steps"
        )
    gap, trace = DECISION_INTERVAL_S, None
    places, places_gap, home_od = _places(spec, traces, prices, on_demand_price)
    if len(traces) == 1:
        from mncloud.plan.traces import load_trace

        gap, trace = load_trace(traces[0]).gap, str(Path(traces[0]).resolve())
    gap = places_gap or gap
    if places and spec.min_nodes is not None:
        raise SpecError(
            "--min-nodes runs on one place: give one --spot-trace (or one region), or drop "
            "--min-nodes"
        )
    if not places and len(prices) > 1:
        per_place(prices, 1, "one place")  # SpecError: one price per place, but one place
    home_spot = places[0].spot_price if places else (prices[0] if prices else None)
    spot_price, on_demand_price = _prices(
        spec, options, (home_spot, on_demand_price or home_od), deadline_s, budget
    )
    minutes = options.recovery_minutes
    ckpt = spec.ckpt_uri
    config = ControlConfig(
        backend=backend_name(spec),
        nodes=spec.nodes,
        hours=options.hours,
        deadline_s=deadline_s,
        budget=budget,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        gap_s=gap,
        overhead_s=(DEFAULT_RECOVERY_MINUTES if minutes is None else minutes) * 60,
        time_scale=time_scale or 1.0,
        pace_step_s=options.hours * 3600 / pace_steps if pace_steps else None,
        trace=trace,
        policy=policy,
        min_nodes=spec.min_nodes,
        state_uri=layout.control_state_uri(ckpt) if ckpt and not spec.is_local else None,
        places=places,
    )
    config.job()  # SpecError when the deadline cannot be met
    state = ControlState(
        name=spec.name,
        config=config,
        spec=spec.model_dump(mode="json"),
        options=options.model_dump(mode="json"),
        existing=existing,
    )
    if existing == "resume":
        state.spent_before = spent_so_far(spec.name)
        if budget is not None and budget < state.spent_before:
            raise SpecError(
                f"--budget ${budget:,.2f} is below what {spec.name} has already cost "
                f"(${state.spent_before:,.2f}); raise it or drop --budget"
            )
    return state


def _listed(value: Any) -> list[Any]:
    """One value, several, or none, as a list."""
    if value is None:
        return []
    if isinstance(value, (str, Path, int, float)):
        return [value]
    return list(value)


def _places(
    spec: JobSpec,
    traces: list[Path],
    prices: list[float],
    on_demand_price: float | None,
) -> tuple[tuple[PlaceConfig, ...], int | None, float | None]:
    """Several places (`control/placing.py`), their common gap (local) and the home place's
    on-demand price (clouds, when not given); ((), None, None) for one place."""
    if len(traces) > 1:
        places, gap = local_places(traces, prices, LOCAL_SPOT_PRICE)
        return places, gap, None
    if spec.is_local:
        return (), None, None
    places = cloud_places(spec, prices)
    if not places or on_demand_price is not None:
        return places, None, None
    return places, None, home_on_demand_price(spec, places[0])


def _check_flags(
    spec: JobSpec,
    *,
    hours_given: bool,
    spot_trace: Path | None,
    time_scale: float | None,
    pace_steps: int | None = None,
) -> None:
    """The deadline flags that cannot go together, or not with this backend."""
    if not hours_given:
        raise SpecError("--deadline needs --hours: the work the job needs at full speed")
    if time_scale is not None and time_scale <= 0:
        raise SpecError(f"--time-scale {time_scale:g}: it must be greater than 0")
    if not spec.is_local and (spot_trace, time_scale, pace_steps) != (None, None, None):
        flag = "--spot-trace" if spot_trace is not None else "--time-scale"
        flag = "--pace-steps" if pace_steps is not None else flag
        raise SpecError(
            f"{flag} is for --cloud local (a rehearsal); a cloud's spot capacity comes from "
            "SkyPilot's managed job"
        )
    if not spec.is_local and spec.bucket is None:
        raise SpecError(
            "--deadline on a cloud needs --bucket: the controller keeps its state there"
        )


def spent_so_far(name: str) -> float:
    """What every run record of the name has cost so far."""
    from mncloud.records.ledger import cost_summary
    from mncloud.records.store import list_records

    return sum(cost_summary(record).total for record in list_records(name))


def _prices(
    spec: JobSpec,
    options: LaunchOptions,
    given: tuple[float | None, float | None],
    deadline_s: float,
    budget: float | None,
) -> tuple[float, float]:
    """USD per node-hour (spot, on-demand): as given, else local rehearsal units, else the
    cheapest of each market in one plan over both; a cloud run over --budget is refused."""
    spot, on_demand = given
    if spec.is_local:
        return (
            LOCAL_SPOT_PRICE if spot is None else spot,
            LOCAL_ON_DEMAND_PRICE if on_demand is None else on_demand,
        )
    from mncloud.launch import plan_request
    from mncloud.plan import make_plan
    from mncloud.spec import SpotPolicy

    plan = make_plan(plan_request(spec.updated(spot=SpotPolicy.EITHER), options))
    if budget is not None:
        from mncloud.deadline.pricing import refuse_over_budget

        refuse_over_budget(plan, deadline_s, budget)

    def cheapest(is_spot: bool) -> float:
        prices = [c.hourly_per_node for c in plan.candidates if c.spot is is_spot]
        if not prices:
            market = "spot" if is_spot else "on-demand"
            raise SpecError(f"--deadline needs a {market} offer for the request; none fits")
        return float(min(prices))

    return (
        cheapest(True) if spot is None else spot,
        cheapest(False) if on_demand is None else on_demand,
    )


def start(state: ControlState) -> ControlState:
    """Save the state and start the controller where it runs (see the module docstring).

    `up --resume` of a local deadline run whose controller died without ending it restarts
    that controller from its own state (`revive`) instead: the run goes on as decided.
    """
    name = state.name
    if runs_here(state) and state.existing == "resume":
        old = _unfinished(name)
        if old is not None:
            if controller_running(name):
                raise SpecError(
                    f"run {name!r} has a deadline controller running ({old.controller}); "
                    f"follow it with `mncloud status {name}` or stop it with `mncloud down {name}`"
                )
            revive(name, force=True)
            return load_state(name, fresh=False)
    if state.existing == "refuse":  # here, where the user sees it, not in the controller's log
        from mncloud.launch import Existing, settle_existing
        from mncloud.spec import JobSpec

        settle_existing(JobSpec.model_validate(state.spec), Existing.REFUSE)
    if runs_here(state):
        clear_stop_request(name)
        save_state(state)
        keeper = _spawn_local(name)
        state.controller = f"this machine, keeper pid {keeper}"
        return state  # the controller writes the state from now on
    from mncloud.control.down import host_of
    from mncloud.control.lease import take

    host = host_of(state)
    info, min_version = host.api_login()  # refused before anything is cancelled or launched
    api_server = _api_server(host)
    check_identity(info, api_server, os.environ, min_version)
    check_token_life(info, state.config.deadline_s, min_version, os.environ)
    # A successor gets a fresh token: where SkyPilot gives the controller one, which it does
    # only for a task with `api_server_access` (no password in the endpoint: `_control_yaml`).
    hands_off = gets_skypilots_token(info, min_version) and redact_url(api_server) == api_server
    state.config = state.config.model_copy(update={"hands_off": hands_off})
    take(state)  # one controller per run: a live one refuses this `up` (or `--replace` ends it)
    try:
        state.controller_job_id = launch_sky(state)
    except AnswerLost:  # sent: it may run, on the state saved for it (never "failed")
        raise BackendError(
            f"run {name!r}: the launch of its deadline controller ({name}-control) was sent but "
            f"SkyPilot's answer was lost; it may be running: `mncloud status {name}` shows it "
            f"once the API server answers, `mncloud down {name}` stops it"
        ) from None
    except MncloudError as err:  # no phantom PENDING run: the state says it never started
        state.phase, state.detail = "failed", f"the controller was not launched: {err}"
        save_state(state)
        raise
    state.controller = f"SkyPilot managed job {state.controller_job_id} ({name}-control)"
    save_state(state)
    return state


def runs_here(state: ControlState) -> bool:
    """Whether the run's backend runs it on this machine, and so its controller too."""
    from mncloud.backends.registry import get_backend

    return get_backend(state.config.backend).runs_here


def _unfinished(name: str) -> ControlState | None:
    try:
        state = load_state(name, fresh=False)
    except MncloudError:
        return None
    return None if state.final else state


def revive(name: str, *, force: bool = False) -> int | None:
    """Restart a local controller that died before its run ended; its keeper's pid, or None
    when nothing was to do (no controller state, a final one, one running, or `down` asked
    it to stop). `force` (`up --resume`): even one `down` asked to stop."""
    state = _unfinished(name)
    if state is None or not runs_here(state) or controller_running(name):
        return None
    if stop_requested(name) is not None:
        if not force:
            return None
        clear_stop_request(name)
    return _spawn_local(name)


def _spawn_local(name: str) -> int:
    """Start the controller's keeper (which starts the controller), detached."""
    from mncloud.control.keeper import command

    log_path = layout.control_log(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command(name),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives `up` and its terminal
        )
    return proc.pid


def render_control_task(
    state: ControlState, api_server: str, access: ControllerAccess | None = None
) -> str:
    """The controller's own SkyPilot task (YAML text) from `templates/control.yaml.j2`: its
    envs and the names of its secrets (`access.py`; the values never rendered)."""
    import json
    import shlex

    import jinja2

    from mncloud import __version__
    from mncloud.render import template_dir

    spec = state.spec
    if access is None:
        access = controller_access(
            api_server, list(spec.get("secrets") or []), os.environ, spec.get("envs")
        )
    source = Path(__file__).resolve().parents[2]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["yaml"] = json.dumps  # JSON is YAML: every value safely quoted
    values: dict[str, Any] = {
        "name": state.name,
        "workdir": spec["workdir"],
        "state_uri": state.config.state_uri,
        "envs": access.envs,
        "secrets": sorted(access.secrets),
        "api_server_access": redact_url(api_server) == api_server,  # access.check_identity
        "version": __version__,
        "max_restarts": CONTROL_MAX_RESTARTS,
        "recovery_strategy": CONTROL_RECOVERY,
        "source": str(source) if (source / "pyproject.toml").is_file() else None,
    }
    return env.get_template(CONTROL_TEMPLATE).render(**values)


def launch_sky(state: ControlState, envs: dict[str, str] | None = None) -> int | None:
    """Launch the controller as a CPU managed job (`envs`: plain envs added to its task, a
    successor's hand-off key: `handoff.py`); return its job id."""
    import yaml

    from mncloud.control.down import host_of

    host = host_of(state)
    api_server = _api_server(host)
    spec = state.spec
    access = controller_access(
        api_server, list(spec.get("secrets") or []), os.environ, spec.get("envs")
    )
    access.envs.update(envs or {})
    save_state(state)  # to the bucket too: the controller starts from there
    config = yaml.safe_load(render_control_task(state, api_server, access))
    return host.launch_controller(state.name, config, access.secrets)


def _api_server(host: ControllerHost) -> str:
    """The SkyPilot API server the controller will use; it must be reachable from the cloud."""
    url = os.environ.get("SKYPILOT_API_SERVER_ENDPOINT") or host.api_server_url()
    if on_this_machine_only(url):
        raise SpecError(
            f"--deadline on a cloud runs its controller as a SkyPilot job, which must reach "
            f"your SkyPilot API server; {redact_url(url)} is on this machine only: deploy one and "
            "`sky api login -e URL`"
        )
    return url


#: How long `mncloud down` waits for a local controller to stop its run and exit, beyond the
#: preemption notice it gives the nodes.
STOP_WAIT_S = 60.0


def stop(name: str, notice_s: float = 0.0) -> str:
    """Stop a run's deadline controller (`mncloud down`); return what was done.

    The stop request is written first (nothing restarts the controller after it). Local:
    SIGTERM, and the controller takes the run down, after a preemption notice of `notice_s`
    to its nodes, and exits (its keeper with it); `down` waits for both. SkyPilot: the
    controller's managed job, then every training job, cancelled by id (`down.py`), even
    when the controller's state is already final (a second `down` finds nothing live).
    """
    state = load_state(name, fresh=False)
    request_stop(name, notice_s)
    if not runs_here(state):
        from mncloud.control.down import stop_cloud

        return stop_cloud(state, notice_s)
    if state.final:
        return f"controller already {state.phase}"
    import psutil

    procs = []
    for pid in {state.pid, state.keeper_pid} - {None}:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if "mncloud" in " ".join(proc.cmdline()) and name in proc.cmdline():
                procs.append(proc)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _gone, alive = psutil.wait_procs(procs, timeout=notice_s + STOP_WAIT_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    _mark_stopped(name, "stopped by mncloud down")
    return "controller stopped"


def _mark_stopped(name: str, why: str) -> None:
    from mncloud.deadline.policy import Mode

    state = load_state(name, fresh=False)
    if not state.final:
        state.phase, state.market, state.mode, state.detail = "stopped", Mode.NONE, Mode.NONE, why
        state.closing = state.launching = None
        save_state(state)
