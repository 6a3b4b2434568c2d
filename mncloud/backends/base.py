"""The interface every engine implements; the CLI and `launch.py` never know which one runs.

`local` runs the rendered task on this machine (N simulated nodes); `skypilot` hands it to
SkyPilot (a cluster for on-demand, a managed job for spot). Engines are found by name in
`registry.py`; a run's status with its checkpoint and stragglers is `mncloud.operate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field, computed_field

from mncloud.spec import LaunchOptions

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mncloud.plan import Plan
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
    deadline: DeadlineStatus | None = None
    """A `--deadline` run's controller view (filled by `run_status`), else None."""
    recovery: str = "gang"
    """`node`: a lost node is replaced alone (the others train on); `gang`: all relaunch."""
    node_states: dict[int, str] = Field(default_factory=dict)
    """Node recovery: each node's state (running, replacing, healing, finished, stopped)."""
    quorum: list[int] = Field(default_factory=list)
    """Node recovery: the nodes in the replicas' newest quorum."""
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

    def logs(self, run_name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of output, each prefixed with its node (and rank where known)."""
        ...

    def down(self, run_name: str, *, notice_s: float = 0.0, by: str = "mncloud down") -> RunStatus:
        """Stop the run and release what it holds; idempotent. With `notice_s`, the nodes
        first get a preemption notice of that many seconds to save the step they reached."""
        ...
