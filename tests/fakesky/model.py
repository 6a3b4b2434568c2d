"""The fake's managed-jobs table: jobs, their tasks, the states a task goes through, and the
row the server's queue answers for each task (`ManagedJobRecord`'s columns)."""

from __future__ import annotations

import enum
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sky.jobs import ManagedJobStatus as S


class Event(enum.Enum):
    """What happens to a managed job's task in a script, besides a plain state."""

    ERROR = "the user's program exited 1"
    PREEMPT = "the cluster was preempted"


ERROR, PREEMPT = Event.ERROR, Event.PREEMPT


@dataclass(frozen=True)
class User:
    """A user of the API server: `user_hash` is what the jobs table keeps (`job_info`)."""

    name: str
    user_hash: str


LAPTOP = User("alice", "a1ce0001")


@dataclass
class FakeTask:
    """One task of a managed job (a plain job has one)."""

    name: str
    status: S = S.PENDING
    primary: bool | None = None
    max_restarts: int = 0
    recover_codes: list[int] = field(default_factory=list)
    restarts_on_errors: int = 0
    recovery_count: int = 0
    failure_reason: str | None = None
    cloud: str | None = None
    region: str | None = None
    start_at: float | None = None
    end_at: float | None = None
    last_recovered_at: float = -1.0
    """SkyPilot's column: -1 until the task starts, then when its current stint began."""
    job_duration: float = 0.0
    """SkyPilot's column: run seconds before `last_recovered_at` (the queue adds the rest)."""
    running_s: float = 0.0
    """Seconds VMs held this task running so far (RUNNING, WINDING_DOWN, and CANCELLING while
    they are torn down): what the cloud bills. Closed spans; `running_since` the open one."""
    running_since: float | None = None
    script: deque[S | Event] = field(default_factory=deque)


@dataclass
class FakeJob:
    """A managed job: what the "server" loaded from the YAML the client sent."""

    job_id: int
    name: str
    dag: Any
    yaml: str
    tasks: list[FakeTask]
    submitted_at: float = field(default_factory=time.time)
    user: User = LAPTOP

    @property
    def live(self) -> bool:
        return any(not t.status.is_terminal() for t in self.tasks)


class JobModel:
    """How a task's state moves: scripts, cancels, recoveries (a mixin of `FakeSky`)."""

    jobs: dict[int, FakeJob]
    next_job_id: int
    _cancelling: dict[tuple[int, int], int]
    clock: Callable[[], float] | None
    """The server's clock (a test's fake clock); None: `time.time`."""

    def now(self) -> float:
        return self.clock() if self.clock is not None else time.time()

    def _next_id(self) -> int:
        job_id = max([self.next_job_id - 1, *self.jobs]) + 1
        self.next_job_id = job_id + 1
        return job_id

    def _tasks(self, job_id: int, task: str | None) -> list[FakeTask]:
        job = self.jobs[job_id]
        found = [t for t in job.tasks if task is None or t.name == task]
        if not found:
            raise KeyError(f"job {job_id} has no task {task!r}")
        return found

    def _advance(self, job: FakeJob, one: FakeTask) -> None:
        """One queue read's worth of time for a task: a cancel completes, a script steps."""
        key = (job.job_id, job.tasks.index(one))
        if one.status is S.CANCELLING:
            self._cancelling[key] = self._cancelling.get(key, 1) - 1
            if self._cancelling[key] <= 0:
                self._enter(one, S.CANCELLED)
            return
        if one.script and not one.status.is_terminal():
            self._step(one, one.script.popleft())

    def _step(self, one: FakeTask, step: S | Event) -> None:
        if step is Event.PREEMPT:
            self._enter(one, S.RECOVERING, "Cluster preempted or failed, recovering")
        elif step is Event.ERROR:
            one.restarts_on_errors += 1
            if one.restarts_on_errors <= one.max_restarts:
                reason = (
                    "Job exited with exit code 1. Restarting the job (restart "
                    f"{one.restarts_on_errors} of {one.max_restarts} on errors)."
                )
                self._enter(one, S.RECOVERING, reason)
            else:
                self._enter(one, S.FAILED, "Job exited with exit code 1 (user program failure).")
        else:
            self._enter(one, step)

    def _enter(self, one: FakeTask, status: S, reason: str | None = None) -> None:
        """`one` enters `status` now, its times kept as `sky/jobs/state.py` keeps them
        (`set_started_async`, `set_recovering_async`, `set_recovered_async`, `set_failed`)."""
        now, before = self.now(), one.status
        if status is S.RUNNING and before is S.RECOVERING:
            one.recovery_count += 1
            one.last_recovered_at = now
        elif status is S.RUNNING and one.start_at is None:
            one.start_at = one.last_recovered_at = now
        if status is S.RECOVERING and before in _RUNS and one.last_recovered_at >= 0:
            one.job_duration += now - one.last_recovered_at
        if status is S.RECOVERING and one.last_recovered_at < 0:
            one.last_recovered_at = now
        if status.is_failed() and before is S.RECOVERING:
            one.last_recovered_at = now
        holds = status in _RUNS or (status is S.CANCELLING and one.running_since is not None)
        if one.running_since is not None and not holds:
            one.running_s += now - one.running_since
            one.running_since = None
        if holds and one.running_since is None:
            one.running_since = now
        if status.is_terminal():
            one.end_at = now
            one.script.clear()
        if status.is_failed() and reason is None:
            reason = f"{status.value} (set by the test)"
        if reason is not None:
            one.failure_reason = reason
        one.status = status


#: The states in which a task's VMs run it (`job_duration` grows).
_RUNS = (S.RUNNING, S.WINDING_DOWN)


def queue_duration(one: FakeTask, now: float) -> float:
    """The queue's `job_duration` of a task, computed as `sky/jobs/utils.py` computes it."""
    begun = one.last_recovered_at - one.job_duration
    if one.status is S.RECOVERING:
        return one.job_duration
    return (one.end_at or now) - begun if begun > 0 else 0.0


def request_body(sent: dict[str, Any]) -> str:
    """A request's body as the server keeps it (`RequestPayload.request_body`): the payload the
    client sent (`jobs.launch`: its `JobsLaunchBody`, the task's YAML inside), and as every
    body the client's `env_vars` (`SKYPILOT_USER_ID` among them: who sent it)."""
    from sky.server.requests import payloads

    body = sent.get("body")
    if hasattr(body, "model_dump_json"):
        return str(body.model_dump_json())
    plain = {k: repr(v) for k, v in sent.items()}
    return json.dumps({"env_vars": payloads.request_body_env_vars(), **plain})


def record(job: FakeJob, n: int, one: FakeTask, now: float) -> dict[str, Any]:
    """The server's row for task `n` of `job` (every column `ManagedJobRecord` has)."""
    infra = "/".join(v for v in (one.cloud, one.region) if v) or None
    return {
        "job_id": job.job_id,
        "task_id": n,
        "job_name": job.name,
        "task_name": one.name,
        "status": one.status,
        "submitted_at": job.submitted_at,
        "start_at": one.start_at,
        "end_at": one.end_at,
        "last_recovered_at": one.last_recovered_at,
        "job_duration": queue_duration(one, now),
        "recovery_count": one.recovery_count,
        "cloud": one.cloud,
        "region": one.region,
        "infra": infra,
        "failure_reason": one.failure_reason,
        "details": None,
        "is_primary_in_job_group": one.primary,
        "workspace": "default",
        "resources": None,
        "user_yaml": job.yaml or None,
        "user_name": job.user.name,
        "user_hash": job.user.user_hash,
    }


def chunks(text: str, size: int = 17) -> Iterator[str | None]:
    """A log as `preload_content=False` streams it: odd-sized chunks, then None."""
    yield from (text[i : i + size] for i in range(0, len(text), size))
    yield None
