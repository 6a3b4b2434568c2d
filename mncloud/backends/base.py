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

Not yet behind it: a deadline controller that runs beside remote nodes is SkyPilot's alone
(`control/start.py` launches it as a managed job, `control/down.py` and `control/identity.py`
find and cancel its jobs); `tests/test_backend_interface.py` names what is left.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field, computed_field

from mncloud.records.ledger import RunTimes
from mncloud.spec import LaunchOptions

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
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
    """Relaunches of the whole job (preemptions + retried errors)."""
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
