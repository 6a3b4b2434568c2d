"""The deadline controller's configuration and state, and where they are kept.

`ControlConfig` is fixed at `up --deadline` (the job's constants for the policy); `ControlState`
is what the controller rewrites after every decision: the market it runs in, the spot capacity
it has seen (the policy's history), the run records of every launch, progress, slack and cost.
It lives in the run folder (`layout.control_state_file`) and, for a run with a bucket, beside
the checkpoints too (`layout.control_state_uri`): a cloud run's controller runs as a SkyPilot
job, and `mncloud status` on the laptop reads its state there.

The state is a journal too, so a controller that died (`kill -9`, a lost VM) is resumed from
it without a second launch: an action that touches the run is written down before it starts
(`closing`: the live launch is being taken down; `launching`: a decision's launch is under
way) and cleared once it is done; a controller that finds one set finishes that action first
(`Controller.run`). Beside the state: `controller.lock`, held (flock) by the one controller
that runs, so a second one started by a restart exits at once, and `stop.json`, written by
`mncloud down` before it stops the controller, so nothing restarts a controller told to stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mncloud import layout
from mncloud.control.access import scrubbed_json, with_run_envs
from mncloud.deadline.policy import DEFAULT_POLICY, Job, Mode
from mncloud.errors import BackendError, MncloudError, RunNotFoundError
from mncloud.redact import REDACTED

log = logging.getLogger(__name__)

#: Decisions kept in the state (the newest; the run record keeps every switch).
KEEP_DECISIONS = 50
LOCK_FILE = "controller.lock"
STOP_FILE = "stop.json"


class DeadlineStatus(BaseModel):
    """A deadline run as its controller last saw it (`mncloud.control`); hours are run time."""

    mode: str
    """spot, on-demand, waiting, finished, stopped or failed."""
    work_hours: float
    """Work done: the newest complete checkpoint's step × the measured step time."""
    total_hours: float
    """The work the job needs (`--hours`)."""
    slack_hours: float
    """Time left to the deadline minus the work left: what may still go without progress."""
    hours_left: float
    """Time left to the deadline."""
    cost: float
    spot_cost: float
    on_demand_cost: float
    all_on_demand_cost: float
    """What the work done so far would have cost all on-demand (one launch included)."""
    budget: float | None = None
    switches: int = 0
    preemptions: int = 0
    controller: str = ""
    """Where the controller runs (a pid here, or a SkyPilot job)."""
    reason: str = ""
    """The newest decision's reason."""
    place: str | None = None
    """Across places: where the live launch runs."""
    place_costs: dict[str, float] = Field(default_factory=dict)
    """Across places: USD so far by place."""


class PlaceConfig(BaseModel):
    """A place spot can run in (`up --deadline` with several `--region`/`--cloud` choices, or
    several `--spot-trace`s locally): where it is and what a launch there costs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The region, the cloud, or locally the trace's stem."""
    cloud: str | None = None
    region: str | None = None
    spot_price: float = Field(ge=0)
    """USD per node-hour on spot here."""
    launch_cost: float = Field(0.0, ge=0)
    """USD per launch here: the checkpoint's egress from the bucket (0 beside it)."""
    trace: str | None = None
    """Local rehearsal: the spot trace this place's capacity follows."""


class ControlConfig(BaseModel):
    """A deadline run's constants. Durations are *run time*: wall time × `time_scale`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    nodes: int = Field(ge=1)
    hours: float = Field(gt=0)
    """The user's estimate of the work at full speed (`--hours`)."""
    deadline_s: float = Field(gt=0)
    """From the start of the run (`--deadline`)."""
    budget: float | None = Field(None, gt=0)
    """A hard cap in USD (`--budget`)."""
    spot_price: float = Field(ge=0)
    """USD per node-hour."""
    on_demand_price: float = Field(gt=0)
    """USD per node-hour."""
    gap_s: int = Field(gt=0)
    """One decision tick: the trace's gap (local) or `DECISION_INTERVAL_S` (clouds)."""
    overhead_s: float = Field(ge=0)
    """A launch's cost in time: from launch to training again (`--recovery-minutes`)."""
    time_scale: float = Field(1.0, gt=0)
    """Local rehearsal: run time passes this many times faster than wall time."""
    pace_step_s: float | None = Field(None, gt=0)
    """Local rehearsal paced by its training (`--pace-steps`): run seconds a step is worth;
    run time never runs ahead of the steps trained (`pacing.py`)."""
    trace: str | None = None
    """Local rehearsal: the spot trace whose capacity local "spot" nodes follow."""
    policy: str = DEFAULT_POLICY
    min_nodes: int | None = Field(None, ge=1)
    """`--min-nodes`: a spot launch runs on the nodes spot offers, at least this many
    (`control/elastic.py`); None: the whole gang or none."""
    capacity_wait_s: float = Field(900.0, ge=0)
    """Clouds: a spot job still pending after this long means no spot capacity."""
    probe_after_s: float = Field(3600.0, ge=0)
    """Clouds: spot is tried again this long after it was last seen missing."""
    state_uri: str | None = None
    """Where the state is mirrored beside the checkpoints (runs with a bucket)."""
    hands_off: bool = False
    """Clouds: SkyPilot gives each controller job a token of its own, so the controller hands
    the run to a fresh controller job before its token expires (`control/handoff.py`)."""
    places: tuple[PlaceConfig, ...] = ()
    """Two or more: spot in any of them (`control/places.py`); on-demand in the first, the
    home place. None: one place, as `spot_price` and `trace` say."""

    def job(self) -> Job:
        """The policy's view of the job (SpecError when the deadline cannot be met)."""
        return Job.build(
            nodes=self.nodes,
            hours=self.hours,
            deadline_s=self.deadline_s,
            overhead_s=self.overhead_s,
            gap_s=self.gap_s,
            spot_price=self.spot_price,
            on_demand_price=self.on_demand_price,
        )

    def price(self, mode: Mode) -> float:
        """USD per hour of the whole run in a market."""
        per_node = {Mode.SPOT: self.spot_price, Mode.ON_DEMAND: self.on_demand_price}
        return self.nodes * per_node.get(mode, 0.0)


class Decision(BaseModel):
    """One decision, as `status` and the log show it."""

    time: float
    tick: int
    spot_now: bool
    chose: Mode
    work_hours: float
    slack_hours: float
    reason: str = ""
    place: str | None = None
    """Across places: where the choice runs (spot's place, or on-demand's home)."""


class Launching(BaseModel):
    """A decision's launch under way (written before it starts, cleared once it is recorded)."""

    mode: Mode
    tick: int
    reason: str
    at: float
    """Wall time the launch began: a run record of the name from then on is this launch's."""
    decision: Decision
    place: int | None = None
    """Across places: the index of the place launched in."""
    run_id: str | None = None
    """The run record the launch writes, chosen before it starts: a controller restarted
    anywhere finds the launch by it (`control/identity.py`)."""


class LiveLaunch(BaseModel):
    """Who the live launch is, mirrored to the bucket with the rest of the state, so a
    controller restarted on a fresh VM finds it there (`control/identity.py`)."""

    run_id: str
    mode: Mode
    job_ids: list[int] = Field(default_factory=list)
    """SkyPilot's managed-job id(s) of the launch."""
    request_id: str | None = None
    """SkyPilot's request id of the launch."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """The backend's own record of the launch (SkyPilot's `skypilot.json`), to write back."""


class Successor(BaseModel):
    """The controller job a controller hands the run to (`control/handoff.py`)."""

    key: str
    """Its `MNCLOUD_HANDOFF_KEY`: how it knows the run is handed to it."""
    at: float
    """Wall time its launch was sent."""
    job_id: int | None = None
    failed: str | None = None
    """Why it will not take over (its launch failed, its job ended): the stop falls back."""
    handed_at: float | None = None
    """Wall time the run was handed to it: it steers from then on."""


class ControlState(BaseModel):
    """What the controller knows; rewritten after every decision."""

    name: str
    config: ControlConfig
    spec: dict[str, Any]
    """The JobSpec as JSON; the controller flips only its market."""
    options: dict[str, Any]
    """The LaunchOptions as JSON."""
    existing: str = "refuse"
    """What the first launch does with an earlier run of the name (`launch.Existing`)."""
    started_at: float | None = None
    """Wall time of the first decision (tick 0)."""
    held_s: float = 0.0
    """Wall seconds a paced rehearsal held run time back (`pacing.py`)."""
    paused_at_s: float | None = None
    """Paced: the run time the clock stays at while the training catches up (`pacing.py`)."""
    phase: str = "starting"
    """starting, spot, on-demand, waiting, finished, stopped or failed."""
    market: Mode = Mode.NONE
    """The market of the live launch (NONE: nothing runs or is queued)."""
    mode: Mode = Mode.NONE
    """The cluster's mode as the policy sees it: NONE also while a spot job waits for VMs."""
    entered_tick: int = 0
    """The tick the current mode began (its launch overhead counts from there)."""
    entered_at: float | None = None
    """Wall time of the live launch."""
    last_tick: int = -1
    """The newest tick decided."""
    last_launch: Mode | None = None
    """The market of the launch before (a launch in the other one is a switch)."""
    ckpt_uri: str | None = None
    """Where the run's checkpoints are (the backend says, at the first launch)."""
    ckpt_step: int | None = None
    """The newest complete checkpoint step seen."""
    history: list[bool] = Field(default_factory=list)
    """Spot capacity for all nodes at each tick so far (the policy's `history`)."""
    run_ids: list[str] = Field(default_factory=list)
    """The run record of every launch, oldest first (the ledger sums them)."""
    model_work_ticks: int = 0
    """Productive ticks by the replay model: progress until the run measures its own."""
    work_hours: float = 0.0
    slack_hours: float = 0.0
    hours_left: float = 0.0
    spent_before: float = 0.0
    """USD the run name had already cost when this controller started (`--resume`)."""
    spot_cost: float = 0.0
    on_demand_cost: float = 0.0
    launch_costs: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """(spot, on-demand) USD of each launch's ledger when last read: a controller restarted
    on a fresh home, without the earlier launches' records, counts them on (`billing.py`)."""
    switches: int = 0
    moves: int = 0
    """Across places: spot launches in another place than the spot launch before."""
    preemptions: int = 0
    nodes_live: int | None = None
    """The node count of the launch made last (elastic runs change it, `elastic.py`)."""
    nodes_offered: int | None = None
    """Elastic: the spot nodes the market offered at the last look (`Market.offered`)."""
    grow_after_step: int | None = None
    """Elastic: the newest checkpoint step when spot first offered more nodes than the live
    launch has; the launch grows at the first checkpoint past it."""
    spot_missing_since: float | None = None
    """Clouds: wall time spot was last seen missing (it is probed again later)."""
    decisions: list[Decision] = Field(default_factory=list)
    detail: str = ""
    controller: str = ""
    pid: int | None = None
    keeper_pid: int | None = None
    """Local: the process that restarts the controller if it dies (`control/keeper.py`)."""
    resumes: int = 0
    """How often a controller took over this state from one that died."""
    closing: str | None = None
    """Journal: the live launch is being taken down, for this reason."""
    launching: Launching | None = None
    """Journal: a decision's launch is under way."""
    live: LiveLaunch | None = None
    """The launch made last (live, or over and not yet replaced): its run id and job ids."""
    job_ids: list[int] = Field(default_factory=list)
    """Every SkyPilot job id any launch of the run made (`down` makes sure each is over)."""
    earlier_run_ids: list[str] = Field(default_factory=list)
    """The run ids of the launches of the controllers before this one (`up --resume`,
    `--replace`: `control/lease.py`), kept after their jobs were found ended, so `down` and
    the next `up` look for them too; never billed here (`run_ids` is this controller's)."""
    controller_job_id: int | None = None
    """Clouds: the controller's own managed job (`<name>-control`)."""
    controller_key: str = ""
    """Clouds: the `MNCLOUD_HANDOFF_KEY` of the controller that holds the run ("": the one
    `up` launched); a controller with another key does not steer (`control/handoff.py`)."""
    successor: Successor | None = None
    """Clouds: the controller job the run is (being) handed to (`control/handoff.py`)."""
    errors_retried: int = 0
    """Launches that failed in the user's code and were made again (of `--max-restarts`)."""
    relaunches: int = 0
    """Launches made again after the backend failed them (no capacity, its own failure)."""
    relaunch_at: float | None = None
    """Wall time an on-demand relaunch for want of capacity waits for (`outcomes.py`)."""
    vanished_looks: int = 0
    """Looks in a row at a live launch the backend no longer knew."""
    place: int | None = None
    """Across places: the place of the live launch (an index into `config.places`)."""
    place_history: list[list[bool]] = Field(default_factory=list)
    """Across places: spot capacity per tick, per place (`history` is spot anywhere)."""
    place_missing_since: list[float | None] = Field(default_factory=list)
    """Clouds, across places: per place, wall time spot was last seen missing there."""
    run_places: dict[str, str] = Field(default_factory=dict)
    """Across places: the place of each launch's run record."""
    place_costs: dict[str, float] = Field(default_factory=dict)
    """Across places: USD so far by place (the ledgers of its launches)."""
    stop_requested: bool = False
    updated_at: float = 0.0

    @property
    def final(self) -> bool:
        return self.phase in ("finished", "stopped", "failed")

    @property
    def cost(self) -> float:
        return self.spot_cost + self.on_demand_cost

    def note(self, decision: Decision) -> None:
        self.decisions = [*self.decisions, decision][-KEEP_DECISIONS:]

    def deadline_status(self) -> DeadlineStatus:
        """The part of `mncloud status` this state answers."""
        cfg = self.config
        overhead_h = cfg.overhead_s / 3600
        all_od = cfg.price(Mode.ON_DEMAND) * (self.work_hours + overhead_h)
        return DeadlineStatus(
            mode=self.phase,
            work_hours=round(self.work_hours, 4),
            total_hours=cfg.hours,
            slack_hours=round(self.slack_hours, 4),
            hours_left=round(self.hours_left, 4),
            cost=round(self.cost, 4),
            spot_cost=round(self.spot_cost, 4),
            on_demand_cost=round(self.on_demand_cost, 4),
            all_on_demand_cost=round(all_od, 4),
            budget=cfg.budget,
            switches=self.switches,
            preemptions=self.preemptions,
            controller=self.controller,
            reason=self.decisions[-1].reason if self.decisions else self.detail,
            place=cfg.places[self.place].name if cfg.places and self.place is not None else None,
            place_costs={k: round(v, 4) for k, v in self.place_costs.items()},
        )


def save_state(state: ControlState, *, journal: bool = False) -> None:
    """Write the state to the run folder, atomically, then beside the checkpoints.

    The bucket copy is best effort (a warning; the next save writes it again), except with
    `journal` (a launch about to be sent): then a copy not written is a BackendError, and the
    caller sends nothing, since a controller restarted on a fresh VM knows only that copy.

    Both copies have credential-shaped text scrubbed from their messages (SkyPilot's errors
    name the API server's URL, `user:password@` included); the bucket copy keeps the names
    of the `--env` values only (the controller VM gets them as a secret, `RUN_ENVS_SECRET`).
    """
    from mncloud.storage import write_atomic

    state.updated_at = time.time()
    data = scrubbed_json(state.model_dump(mode="json"))
    write_atomic(layout.control_state_file(state.name), json.dumps(data, indent=2).encode())
    if state.config.state_uri:
        envs = data["spec"].get("envs") or {}
        data["spec"] = dict(data["spec"], envs=dict.fromkeys(envs, REDACTED))
        failed = _push(state.config.state_uri, json.dumps(data, indent=2).encode())
        if failed and journal:
            raise BackendError(
                f"the controller's journal could not be written to {state.config.state_uri} "
                f"({failed}); nothing was launched"
            )


def _object(uri: str) -> tuple[Any, str]:
    """The bucket and key of an object URI (`<folder uri>/<file>`)."""
    from mncloud.storage import join_key, open_bucket

    folder, _, filename = uri.rpartition("/")
    bucket, prefix = open_bucket(folder, retry_seconds=5.0)
    return bucket, join_key(prefix, filename)


def _push(uri: str, payload: bytes) -> str | None:
    """Write the bucket copy; why it failed, or None."""
    try:
        bucket, key = _object(uri)
        bucket.put_bytes(key, payload)
    except Exception as err:  # the mirror must never stop the controller
        log.warning("controller state not written to %s: %s", uri, err)
        return str(err) or type(err).__name__
    return None


def load_state(name: str, *, fresh: bool = True) -> ControlState:
    """A run's controller state; with `fresh`, the bucket copy when it is newer.

    RunNotFoundError when the run has no controller (it was not launched with `--deadline`).
    """
    path = layout.control_state_file(name)
    if not path.is_file():
        raise RunNotFoundError(f"run {name!r} has no deadline controller")
    try:
        state = ControlState.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as err:
        raise MncloudError(
            f"controller state {path} is unreadable ({type(err).__name__})"
        ) from None
    if fresh and state.config.state_uri:
        remote = load_uri(state.config.state_uri)
        if remote is not None and remote.updated_at > state.updated_at:
            return remote
    return state


def load_uri(uri: str) -> ControlState | None:
    """The state stored at a bucket URI, or None when it is missing or unreadable."""
    with contextlib.suppress(Exception):
        bucket, key = _object(uri)
        state = ControlState.model_validate_json(bucket.get_bytes(key))
        state.spec = with_run_envs(state.spec, os.environ)
        return state
    return None


def controlled_runs() -> list[str]:
    """Names of the runs on this machine that have a deadline controller."""
    root = layout.runs_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if layout.control_state_file(p.name).is_file())


def stop_request_file(name: str) -> Path:
    """`mncloud down`'s word to the controller (and to whatever would restart it)."""
    return layout.control_dir(name) / STOP_FILE


def request_stop(name: str, notice_s: float) -> None:
    """Write down that the run is to stop, with the preemption notice its nodes get."""
    from mncloud.storage import write_atomic

    payload = json.dumps({"t": time.time(), "notice_s": notice_s})
    write_atomic(stop_request_file(name), payload.encode())


def stop_requested(name: str) -> dict[str, Any] | None:
    """The stop request of a run (`notice_s`), or None."""
    with contextlib.suppress(OSError, ValueError):
        value = json.loads(stop_request_file(name).read_text())
        return value if isinstance(value, dict) else {}
    return None


def clear_stop_request(name: str) -> None:
    """A fresh start of the name: an old `down` no longer applies."""
    stop_request_file(name).unlink(missing_ok=True)


def hold_lock(name: str, wait: float = 0.0) -> int | None:
    """Take the controller lock of a run for this process's lifetime; its fd, or None when
    another controller still holds it after `wait` seconds. The kernel releases it when the
    process dies, however it dies."""
    path = layout.control_dir(name) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def controller_running(name: str) -> bool:
    """True while a controller of the run holds its lock (on this machine)."""
    fd = hold_lock(name)
    if fd is None:
        return True
    os.close(fd)  # closing the only fd releases the lock
    return False
