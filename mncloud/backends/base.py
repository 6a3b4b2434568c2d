"""The interface every engine implements; callers never ask which one runs a run.

`local` runs the rendered task on this machine (N simulated nodes); `skypilot` hands it to
SkyPilot (a managed job, spot or on-demand; `--cluster` keeps a plain cluster up instead).
Engines are found by name in `registry.py`; a run as the user sees it (its checkpoint, stragglers, a
deadline controller's view) is `mncloud.operate`, built on this interface alone.

What differs between engines is a member of `Backend`, never a test of its name or class.
A new engine (Kubernetes, Slurm) is one package plus one line in `registry._REGISTRY`; its
class implements:

    name, records_own_events, runs_here       what callers may ask of it
    settled, launch, exec, measure_bandwidth  the write side (`launch.py`, `exec`, `doctor`)
    status, logs (since=), down               a run it holds (`status`, `logs`, `down`)
    diagnose, ckpt_uri_of, legacy_steps       the files it keeps of a run, for `status`/`runs`
    down_unrecorded                           a run of a name it launched with no record here
    launch_took, take_node                    what a deadline controller asks of it
    controller_host                           a cloud deadline controller's own jobs and the
                                              training jobs it launched (`ControllerHost`)
    rehearsal                                 a run on this machine, live and summed up

The last two apply to one kind of engine each: an engine whose nodes run here (`runs_here`)
refuses `controller_host` (its controller is a process here, `control/keeper.py`), one whose
nodes are elsewhere refuses `rehearsal`; callers ask `runs_here` first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field, computed_field

from mncloud.records.ledger import RunTimes
from mncloud.spec.launch import LaunchOptions

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from pathlib import Path

    from mncloud.plan import Plan
    from mncloud.records.goodput import StepMark
    from mncloud.render import RenderedTask
    from mncloud.spec import JobSpec


class RunState(str, Enum):
    """Life cycle of a run, the same words for every backend."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class Failure(str, Enum):
    """Why a run ended FAILED, in the words the deadline controller acts on."""

    USER = "user"
    """The user's code or setup exited non-zero: retried `--max-restarts` times, counted."""
    CAPACITY = "capacity"
    """No VMs could be had for the request: another market or place may have them."""
    INFRA = "infra"
    """The backend's own machinery failed (SkyPilot's jobs controller): launched again."""
    REFUSED = "refused"
    """The backend refused the request before trying (SkyPilot's prechecks): no retry helps."""
    VANISHED = "vanished"
    """The backend no longer knows the job (an empty queue)."""


class RunStatus(BaseModel):
    """What `mncloud status` shows for one run."""

    name: str
    backend: str
    state: RunState
    nodes: int
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    restarts: int = 0
    """Relaunches of the whole job (preemptions, storage outages and retried errors)."""
    preemptions: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    hourly_total: float | None = None
    """USD per hour for all nodes, when known."""
    ckpt_uri: str | None = None
    ckpt_step: int | None = None
    """Newest complete checkpoint step in the bucket (filled by `run_status`)."""
    detail: str = ""
    """One line: the newest event or the reason of a failure."""
    failure: Failure | None = None
    """A FAILED run: why, when the backend says (None: the user's code, as locally)."""
    step_times: dict[int, float] = Field(default_factory=dict)
    """Mean seconds per step by global rank, as the ranks last published them (`runs`)."""
    stragglers: list[int] = Field(default_factory=list)
    """Ranks at least `runs.STRAGGLER_FACTOR` × slower than the median (filled by `run_status`)."""
    recovery: str = "gang"
    """`node`: a lost node is replaced alone (the others train on); `gang`: all relaunch."""
    node_states: dict[int, str] = Field(default_factory=dict)
    """Node recovery: each node's state (running, replacing, healing, finished, stopped)."""
    quorum: list[int] = Field(default_factory=list)
    """Node recovery: the nodes in the replicas' newest quorum."""
    times: RunTimes | None = None
    """When the backend's VMs ran the job, as its scheduler reports it (SkyPilot's queue):
    what the ledger bills (`records.ledger.catch_up`); None where the backend does not say."""
    bandwidth: dict[str, Any] | None = None
    """The preflight's all-reduce test (`doctor/bandwidth.py`): `busbw_gbs`, per-size figures,
    the expectation and fabric; None before it ran (or on one node)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_so_far(self) -> float | None:
        if self.hourly_total is None or self.started_at is None:
            return None
        end = self.ended_at or time.time()
        return self.hourly_total * max(0.0, end - self.started_at) / 3600.0


@dataclass
class LaunchRequest:
    """Everything `up` hands a backend: the request, its plan and the rendered task."""

    spec: JobSpec
    task: RenderedTask
    plan: Plan | None = None
    detach: bool = False
    dryrun: bool = False
    options: LaunchOptions = field(default_factory=LaunchOptions)
    """How to run it (local: recovery_delay, chaos_preempt_after)."""
    run_id: str | None = None
    """The run record's id (None for a dry run)."""
    record_events: bool = True
    """Whether the backend writes the run record's events; a deadline controller writes its
    own (`control/loop.py`)."""


@runtime_checkable
class Backend(Protocol):
    """The engine behind `up`, `status`, `logs` and `down`."""

    name: str
    records_own_events: bool
    """True: the engine writes its runs' events (each relaunch, the end) to the run record
    itself, whatever `LaunchRequest.record_events` says (the local supervisor); False: the
    launcher writes them (a deadline controller), and relaunches the engine makes by itself
    are read off the telemetry (`operate.telemetry.with_relaunches`)."""
    runs_here: bool
    """True: the nodes are processes on this machine, a rehearsal (capacity follows a trace,
    time is scaled, places share the host) whose deadline controller is a process here too;
    False: the nodes are VMs elsewhere and the controller runs beside them."""

    def settled(self, spec: JobSpec) -> JobSpec:
        """The spec as this engine runs it, settled before the plan and render (local: a run
        without `--master-port` meets on a free port, so local runs go side by side)."""
        ...

    def launch(self, request: LaunchRequest) -> RunStatus:
        """Start the run (or, with `dryrun`, check it); return its status."""
        ...

    def exec(self, request: LaunchRequest) -> RunStatus:
        """`mncloud exec`: the request's task again on the run's nodes, which are still there
        (a cluster kept up, a local run's nodes): no provisioning, no setup. SpecError, saying
        what to do, when the run has no such nodes or still runs."""
        ...

    def measure_bandwidth(
        self, run_name: str, minimum: float | None, timeout: float
    ) -> tuple[bool, list[str]]:
        """`mncloud doctor --bandwidth`: the preflight's all-reduce test alone across the
        run's nodes, which are still there; (passed, node 0's lines). SpecError, saying what
        to do, when the run has no such nodes."""
        ...

    def status(self, run_name: str) -> RunStatus:
        """The current status of one run; RunNotFoundError if unknown."""
        ...

    def logs(
        self,
        run_name: str,
        node: int | None = None,
        follow: bool = False,
        *,
        since: float | None = None,
    ) -> Iterator[str]:
        """Lines of output, each prefixed with its node (and rank where known); with `since`
        (a time), those written since then, or BackendError when its logs carry no times."""
        ...

    def down(self, run_name: str, *, notice_s: float = 0.0, by: str = "mncloud down") -> RunStatus:
        """Stop the run and release what it holds; idempotent. With `notice_s`, the nodes
        first get a preemption notice of that many seconds to save the step they reached."""
        ...

    def diagnose(self, folder: Path) -> str | None:
        """Which of the engine's own files in run folder `folder` cannot be read (torn, of
        another schema, missing), and why; None when all can (`status` shows the reason)."""
        ...

    def ckpt_uri_of(self, run_name: str, run_id: str) -> str | None:
        """Where launch `run_id` of the run keeps its checkpoints when its record does not say
        (the local default `file://` folder); None when the engine holds no such default or no
        longer holds that launch."""
        ...

    def legacy_steps(self, run_name: str, run_id: str) -> list[StepMark] | None:
        """Launch `run_id`'s steps as it wrote them before the telemetry segments (a local
        run's `progress.jsonl`); None when this machine holds none of that launch's files."""
        ...

    def launch_took(self, run_name: str, run_id: str) -> bool:
        """Whether launch `run_id` of the run got as far as the engine running it (a deadline
        controller restarted after a crash asks before it adopts the launch)."""
        ...

    def take_node(self, run_name: str, node: int, *, by: str) -> None:
        """A rehearsal's spot capacity dropping under a running launch (`runs_here`): node
        `node` lost at once, as a cloud loses a VM; BackendError where a cloud owns capacity."""
        ...

    def down_unrecorded(self, run_name: str) -> RunStatus:
        """`down` of a run of that name this machine holds no record of (a controller's VM or
        another machine launched it), found where the engine can look; RunNotFoundError when
        it knows none."""
        ...

    def controller_host(self) -> ControllerHost:
        """Where a deadline controller runs beside the remote nodes (SkyPilot: a managed job
        launched through the same API server); BackendError for an engine that `runs_here`."""
        ...

    def rehearsal(self) -> Rehearsal:
        """The live view and summary of a run on this machine (`up` in the foreground);
        BackendError for an engine whose nodes are elsewhere."""
        ...


class HostJob(Protocol):
    """One job as the controller host's queue lists it (a job group: one, all its tasks)."""

    job_id: int
    statuses: list[str]
    """The engine's state of each task, in task order (SkyPilot's words: `RUNNING`, ...)."""
    tasks: list[str]
    """Task names in task order."""
    cloud: str | None
    region: str | None

    @property
    def live(self) -> bool:
        """A task the engine does not report ended (one still tearing down is live)."""
        ...


@dataclass
class Adopted:
    """A launch found in the host's queue that this machine holds no record of (a controller
    restarted on a fresh VM): what its record there is written back from."""

    name: str
    nodes: int
    spot: bool
    launched_at: float | None
    ckpt_uri: str | None
    choice: Mapping[str, Any]
    """The plan's choice, when the run record kept it: cloud, region, instance type, price."""


class ControllerHost(Protocol):
    """A cloud deadline controller's own jobs: it is one (`NAME-control`), and it launches the
    run's training jobs, every one found by the run id in its envs, never by a name alone
    (`control/down.py`, `lease.py`, `identity.py`, `watch.py`, `start.py`)."""

    def api_server_url(self) -> str:
        """The API server the controller will launch through."""
        ...

    def api_login(self) -> tuple[Any, int]:
        """How the API server logs users in (its health answer) and the least API version
        whose tasks can be given a token of their own (`control/access.check_identity`)."""
        ...

    def launch_controller(
        self, run_name: str, config: dict[str, Any], secrets: dict[str, str]
    ) -> int | None:
        """Launch run `run_name`'s controller (its task's config, its secrets' values) as the
        job `RUN_NAME-control`; the job's id. `errors.AnswerLost` when it was sent and what it
        made cannot be told (a lost answer asked again in vain): not a failed launch."""
        ...

    def may_ask(self) -> bool:
        """Whether to ask the host about a run this machine has no record of (a local API
        server not running is not started for a guess)."""
        ...

    def jobs_named(self, name: str) -> list[HostJob]:
        """Every user's jobs named exactly `name`, oldest first."""
        ...

    def jobs_with_env(self, name: str, env: str, values: Iterable[str]) -> list[HostJob]:
        """The jobs named `name` whose tasks carry `env` set to one of `values`, oldest first."""
        ...

    def controller_state_uris(self, name: str) -> list[str]:
        """Where the controllers of run `name` (any user's `NAME-control`) keep their state."""
        ...

    def wait_for_launch_requests(self, run_id: str) -> None:
        """Wait for the host's unfinished launch requests that name `run_id`."""
        ...

    def launches_in_flight(self, job_name: str, *, wait: bool = False) -> list[str]:
        """The host's unfinished launch requests of a job named `job_name` (`wait`: each
        waited for first), by request id."""
        ...

    def settle_launches(
        self, run_ids: Iterable[str], *, wait_s: float, poll_s: float,
        sleep: Callable[[float], None],
    ) -> list[str]:  # fmt: skip
        """Wait up to `wait_s` (a look every `poll_s`, `sleep` between) for the host's
        unfinished launch requests that name one of `run_ids`; those still unfinished then,
        by request id (none: whatever they made, the queue lists)."""
        ...

    def settle_requests(
        self, request_ids: Iterable[str], *, wait_s: float, poll_s: float,
        sleep: Callable[[float], None],
    ) -> list[str]:  # fmt: skip
        """`settle_launches` of these requests (by id): those still unfinished after `wait_s`."""
        ...

    def job_states(self, job_ids: Iterable[int]) -> dict[int, HostJob]:
        """The queue's view of `job_ids` (a job it no longer lists is left out)."""
        ...

    def job_status(self, job: HostJob, name: str, nodes: int, spot: bool) -> RunStatus:
        """The status of `job` of run `name` (its queue times included) where this machine
        holds no record of the launch that made it (an earlier controller's)."""
        ...

    def cancel(
        self,
        job_ids: Iterable[int],
        *,
        wait_s: float | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> list[int]:
        """Cancel the live ones of `job_ids`, by id, and wait (`wait_s`, None: the host's
        default) until the host reports them ended; the ids cancelled. CancelError (naming
        what may still be live) when that is not confirmed."""
        ...

    def give_notice(
        self, ckpt_uri: str, notice_s: float, state_of: Callable[[], RunState], by: str
    ) -> int | None:
        """Ask a running job's nodes, through the bucket, to save within `notice_s`; the step
        they saved (None: none in time)."""
        ...

    def withdraw_notice(self, ckpt_uri: str) -> None:
        """Clear that request (after the job is cancelled)."""
        ...

    def launch_meta(self, run_name: str) -> dict[str, Any] | None:
        """The engine's own record of the run's newest launch (SkyPilot's `skypilot.json`), as
        JSON; None when this machine holds none."""
        ...

    def save_launch_meta(self, meta: Mapping[str, Any]) -> None:
        """Write such a record back (a controller restarted on a fresh VM)."""
        ...

    def adopt(self, job: HostJob, launch: Adopted) -> None:
        """Write back the engine's record of `launch`, found in the queue as `job`."""
        ...


class RecoveryFigures(BaseModel):
    """What a run's relaunches cost, from its events and rank 0's telemetry."""

    attempts: int
    restarts: int
    preemptions: int
    wall_s: float | None
    cold_start_s: float | None
    """From the first launch of the nodes to the first finished training step."""
    resume_s: list[float] = Field(default_factory=list)
    """Per recovery: from the preemption (or failure) to the first finished step after it,
    through any relaunch that trained nothing (one that met a storage outage)."""
    outages: int = 0
    """Relaunches after a storage outage (the nodes' bucket did not answer): backed off, not
    counted against --max-restarts."""
    steps_lost: int = 0
    """Steps trained before a failure and trained again after it."""
    lost_per_recovery: list[int] = Field(default_factory=list)
    resumed_from: list[int | None] = Field(default_factory=list)
    steps_per_attempt: list[list[int]] = Field(default_factory=list)
    final: dict[str, Any] | None = None
    """The script's final.json, when it wrote one."""
    restarted: list[str] = Field(default_factory=list)
    """Attempts that started with a committed `--ckpt-dir` unit and did not resume from it,
    one line each ("attempt 2 started from scratch although checkpoint-40 was committed")."""
    node_losses: int = 0
    """Node recovery: nodes lost and replaced alone (the others trained on)."""
    heal_s: list[float] = Field(default_factory=list)
    """Node recovery: per heal of a replacement, seconds to take the state from a live peer."""
    replica_weights: dict[int, str] = Field(default_factory=dict)
    """Node recovery: each node's final weights sha256 (from its `done` line)."""


class RunProgress(BaseModel):
    """A local run as the CLI shows it while it runs (status line) and after (summary)."""

    name: str
    state: RunState
    ended: bool
    """Final, or its supervisor is gone: nothing more will happen."""
    attempt: int
    restarts: int
    preemptions: int
    step: int | None
    """The newest training step rank 0 reported."""
    started_at: float | None
    ended_at: float | None
    detail: str
    figures: RecoveryFigures | None = None
    """Filled when asked for (`summary=True`): reads the whole telemetry and the bucket."""

    @property
    def elapsed_s(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.ended_at or time.time()) - self.started_at


class ReferenceResult(BaseModel):
    """The uninterrupted reference run of a run, finished or not."""

    state: RunState
    weights_sha256: str | None
    wall_s: float | None
    detail: str


class Rehearsal(Protocol):
    """A run on this machine as `up` in the foreground shows it (`cli/follow.py`)."""

    def progress(self, run_name: str, *, summary: bool = False) -> RunProgress:
        """Where the run is (step, attempt, restarts); with `summary`, its recovery figures."""
        ...

    def run_reference(
        self, run_name: str, on_progress: Callable[[RunProgress], None]
    ) -> ReferenceResult:
        """Run the same task once more without chaos and wait for it."""
        ...


def first_unreadable(
    folder: Path, paths: list[Path], models: Mapping[str, type[BaseModel]]
) -> str | None:
    """The first of `paths` (JSON files) that cannot be read, and why, in `folder`'s words:
    a file named in `models` must validate against its model, any other must parse."""
    from mncloud.errors import first_error

    for path in paths:
        model = models.get(path.name)
        try:
            data = path.read_bytes()
            model.model_validate_json(data) if model else json.loads(data)
        except (OSError, ValueError) as err:
            where = path.relative_to(folder)
            if hasattr(err, "errors"):
                return f"{first_error(err, str(where))} (in {folder})"
            return f"{where}: {type(err).__name__} (in {folder})"
    return None
