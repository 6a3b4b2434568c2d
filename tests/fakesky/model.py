"""The fake's managed-jobs table: jobs, their tasks, the states a task goes through, and the
row the server's queue answers for each task (`ManagedJobRecord`'s columns)."""

from __future__ import annotations

import enum
import json
import time
from collections import deque
from collections.abc import Iterator
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
    last_recovered_at: float | None = None
    running_s: float = 0.0
    """Seconds this task has held RUNNING so far (closed spans; `running_since` the open one)."""
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
        now = time.time()
        if one.status is S.RECOVERING and status is S.RUNNING:
            one.recovery_count += 1  # sky/jobs/state.py set_recovered_async
            one.last_recovered_at = now
        if status is S.RUNNING and one.start_at is None:
            one.start_at = now
        if one.running_since is not None and status is not S.RUNNING:
            one.running_s += now - one.running_since
            one.running_since = None
        if status is S.RUNNING and one.running_since is None:
            one.running_since = now
        if status.is_terminal():
            one.end_at = now
            one.script.clear()
        if status.is_failed() and reason is None:
            reason = f"{status.value} (set by the test)"
        if reason is not None:
            one.failure_reason = reason
        one.status = status


def request_body(sent: dict[str, Any]) -> str:
    """A request's body as the server keeps it (`RequestPayload.request_body`): the payload the
    client sent (`jobs.launch`: its `JobsLaunchBody`, the task's YAML inside)."""
    body = sent.get("body")
    if hasattr(body, "model_dump_json"):
        return str(body.model_dump_json())
    return json.dumps({k: repr(v) for k, v in sent.items()})


def record(job: FakeJob, n: int, one: FakeTask) -> dict[str, Any]:
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
        "job_duration": (one.end_at or time.time()) - (one.start_at or job.submitted_at),
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
