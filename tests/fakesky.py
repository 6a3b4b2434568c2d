"""A fake of SkyPilot 0.14's client SDK that cannot drift from the real one unnoticed.

- **Bound to the real signatures.** Every faked call first binds its arguments to the real
  function's signature (`inspect.signature(real).bind`): a renamed or removed parameter is a
  TypeError in the test, as it would be against the real SDK.
- **The client's own work, for real.** `jobs.launch` runs what the real client does before it
  talks to the server (`sky/jobs/client/sdk.py`): `dag_utils.convert_entrypoint_to_dag`, the
  job name set on the DAG, `dag_utils.dump_dag_to_yaml_str` (a job group's multi-document
  YAML) into SkyPilot's own request body (`payloads.JobsLaunchBody`); the "server" then loads
  that YAML back (`dag_utils.load_dag_from_yaml_str`), as the API server does.
- **Answers through the wire.** What a request returns goes through SkyPilot's own server-side
  encoder, JSON, and the client's decoder (`sky/server/requests/serializers/`), so `sky.get`
  answers exactly the shape the real client gets (`jobs.queue_v2`: records, total, status
  counts, total before filters).
- **Stateful.** A managed-jobs table (id → name, tasks, each task's `ManagedJobStatus`) with
  increasing ids, and clusters. Cancel by `job_ids` moves live tasks to CANCELLING (PENDING
  straight to CANCELLED) and the next queue read to CANCELLED. Cancel by `name` is modelled on
  `sky/jobs/utils.py` `cancel_job_by_name` and `sky/jobs/server/core.py` `cancel`: with several
  live jobs of that name nothing is cancelled and the request still returns None (the
  server's check for the message looks for other words than the message has), so the caller
  learns nothing; the message is kept in `fake.messages`.
- **Scripts.** `fake.script(job_id, [...])` gives a job (or one task of a job group) the states
  it shows on successive queue reads: `ManagedJobStatus` values, or the events `ERROR` (the
  user's program exits 1: RECOVERING while `max_restarts_on_errors` of the job's own
  `job_recovery` allows, else FAILED) and `PREEMPT` (the VMs lost: RECOVERING). A task that
  leaves RECOVERING for RUNNING counts one recovery, as SkyPilot's `set_recovered_async`.
- **Clusters** (`up --cluster`, `exec`): `launch` and `exec` run the client's own work
  (`convert_entrypoint_to_dag`, the YAML into `LaunchBody` / `ExecBody`); the "server" keeps the
  cluster's `sky.status` record (UP, `autostop`, `to_down`), its jobs (`JobStatus`) and the YAML
  of each (`fake.cluster_yamls[name]`); `exec` on a cluster that is not UP fails as the server
  does. `autostop` sets the record's timer. Managed-job paths never call `launch`: their tests
  assert `not fake.called("launch")`.
- **Nothing else gets through.** Every other public function of `sky` and `sky.jobs` that
  would reach the API server raises `AssertionError("unfaked SkyPilot call sky.X")`.
  `sky.server.common.get_api_server_status` answers HEALTHY (UNHEALTHY once `unreachable`),
  so nothing probes a real port.
- `fake.answers[name] = value` (or an exception) overrides the model for one call name;
  `fake.unreachable(after=...)` makes every call raise the SDK's `ApiServerConnectionError`.
- **Requests in flight.** `fake.held.add("jobs.launch")`: the "server" finishes such a request
  only when someone waits for it (`sky.get`), as a real server finishes a request whose client
  died; meanwhile `sky.api_status()` lists it with its body. A job's row carries the YAML the
  client sent as `user_yaml` (SkyPilot's `original_user_yaml_content`).
"""

from __future__ import annotations

import enum
import inspect
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sky
import sky.jobs
from sky import exceptions as sx
from sky.client import sdk as client_sdk
from sky.jobs import ManagedJobStatus as S
from sky.jobs.client import sdk as jobs_sdk
from sky.schemas.api import responses
from sky.server import common as server_common
from sky.server import constants as server_constants
from sky.server.requests import payloads
from sky.server.requests.serializers import decoders, encoders
from sky.utils import dag_utils

_MODEL = object()


class Event(enum.Enum):
    """What happens to a managed job's task in a script, besides a plain state."""

    ERROR = "the user's program exited 1"
    PREEMPT = "the cluster was preempted"


ERROR, PREEMPT = Event.ERROR, Event.PREEMPT


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

    @property
    def live(self) -> bool:
        return any(not t.status.is_terminal() for t in self.tasks)


class FakeSky:
    """SkyPilot's API server, answered locally; every call recorded as (name, args, kwargs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}
        self.jobs: dict[int, FakeJob] = {}
        self.clusters: dict[str, dict[str, Any]] = {}
        self.cluster_yamls: dict[str, list[str]] = {}
        """Per cluster, the YAML of each task `launch` and `exec` sent, in order."""
        self.messages: list[str] = []
        self.logs: dict[tuple[int | str, str | int | None], str] = {}
        """A managed job's log by (job id or name, task); a cluster's by (name, job id or None)."""
        self.on_job: Callable[[str, int, str], object] | None = None
        """Called with (cluster, job id, task YAML) for each job `launch` or `exec` puts on a
        cluster: what the cluster does with it (`tests/skynodes.py` runs it on local nodes)."""
        self.next_job_id = 1
        self.cancel_polls = 1
        """Queue reads a cancelled live task stays CANCELLING before it is CANCELLED."""
        self._results: dict[str, tuple[str, Any]] = {}
        self._down_after: str | None = None
        self._down = False
        self._cancelling: dict[tuple[int, int], int] = {}
        self.held: set[str] = set()
        """Call names whose requests stay in flight until someone waits for them."""
        self._in_flight: dict[str, tuple[str, str, Callable[[], Any]]] = {}

    # ------------------------------------------------------------------ test controls

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for n, args, kwargs in self.calls if n == name]

    def job(self, job_id: int) -> FakeJob:
        return self.jobs[job_id]

    def add_job(self, name: str, status: S = S.RUNNING, tasks: list[str] | None = None) -> int:
        """A managed job launched by someone else (another machine, a controller VM)."""
        job_id = self._next_id()
        names = tasks or [name]
        group = len(names) > 1
        self.jobs[job_id] = FakeJob(
            job_id, name, None, "", [FakeTask(t, status, True if group else None) for t in names]
        )
        return job_id

    def set_status(
        self, job_id: int, status: S, task: str | None = None, reason: str | None = None
    ) -> None:
        """Put a job (every task, or `task`) in `status` now."""
        for one in self._tasks(job_id, task):
            self._enter(one, status, reason)

    def script(self, job_id: int, steps: list[S | Event], task: str | None = None) -> None:
        """The states a job (or its `task`) shows on its next queue reads, one per read."""
        for one in self._tasks(job_id, task):
            one.script.extend(steps)

    def unreachable(self, after: str | None = None) -> None:
        """The API server goes away: now, or once the client has the result of the next
        request named `after` (`jobs.cancel`: the cancel done, nothing after it answered)."""
        if after is None:
            self._down = True
        else:
            self._down_after = after

    def reachable(self) -> None:
        self._down, self._down_after = False, None

    def add_cluster(self, name: str, record: dict[str, Any], jobs: dict[int, Any]) -> None:
        """A cluster (an on-demand run of an older mncloud): its `sky.status` record (the
        shape of `StatusResponse`) and its jobs' `JobStatus`es."""
        self.clusters[name] = {"record": record, "jobs": jobs}

    # ------------------------------------------------------------------ requests

    def _request(
        self, name: str, server: Callable[..., Any], client: Callable[..., Any] | None = None
    ) -> Callable[..., str]:
        """A faked SDK call: bound to the real signature, the client's own work done (`client`,
        whose errors raise at once, as the real client's), recorded, answered by `server` (or
        by `answers[name]`), its result kept for `sky.get` under a request id."""
        real = _real(name)

        def call(*args: Any, **kwargs: Any) -> str:
            bound = inspect.signature(real).bind(*args, **kwargs)
            bound.apply_defaults()
            sent = client(**bound.arguments) if client is not None else bound.arguments
            self._check_reachable()
            self.calls.append((name, args, kwargs))
            request_id = f"req-{len(self.calls)}-{name}"
            answer = self.answers.get(name, _MODEL)

            def answer_it() -> Any:
                if answer is not _MODEL:
                    return answer
                try:
                    return _wire(name, server(**sent))
                except Exception as err:  # the request fails: raised by sky.get
                    return err

            if name in self.held:
                self._in_flight[request_id] = (name, _request_body(sent), answer_it)
                return request_id
            self._results[request_id] = (name, answer_it())
            return request_id

        call.__wrapped__ = real  # type: ignore[attr-defined]
        return call

    def _stream(self, name: str, server: Callable[..., Any]) -> Callable[..., Any]:
        """A faked streaming call (`tail_logs(preload_content=False)`): the chunks at once."""
        real = _real(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(real).bind(*args, **kwargs)
            bound.apply_defaults()
            self._check_reachable()
            self.calls.append((name, args, kwargs))
            return server(**bound.arguments)

        call.__wrapped__ = real  # type: ignore[attr-defined]
        return call

    @property
    def server_url(self) -> str:
        """The API server the SDK would talk to (named in `ApiServerConnectionError`)."""
        return str(server_common.get_server_url())

    def _check_reachable(self) -> None:
        if self._down:
            raise sx.ApiServerConnectionError(self.server_url)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(_real("get")).bind(*args, **kwargs)
        return self._result(bound.arguments["request_id"])

    def stream_and_get(self, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(_real("stream_and_get")).bind(*args, **kwargs)
        return self._result(bound.arguments["request_id"])

    def _result(self, request_id: str) -> Any:
        self._check_reachable()
        if request_id in self._in_flight:
            name, _body, answer_it = self._in_flight.pop(request_id)
            self._results[request_id] = (name, answer_it())
        name, value = self._results[request_id]
        if self._down_after == name:
            self._down = True
        if isinstance(value, BaseException):
            raise value
        return value

    def _api_status(self, request_ids: Any, all_status: bool, **_kw: Any) -> list[Any]:
        """The server's unfinished requests (`held` ones), as `sky.api_status` lists them."""
        rest = {"entrypoint": "", "status": "RUNNING", "created_at": time.time(), "user_id": "0",
                "return_value": "null", "error": "null", "pid": None,
                "schedule_type": "long"}  # fmt: skip
        return [
            payloads.RequestPayload(request_id=request_id, name=name, request_body=body, **rest)
            for request_id, (name, body, _answer) in self._in_flight.items()
            if request_ids is None or any(request_id.startswith(r) for r in request_ids)
        ]

    # ------------------------------------------------------------------ managed jobs

    @staticmethod
    def _jobs_launch_client(task: Any, name: str | None, **_rest: Any) -> dict[str, Any]:
        """What `sky/jobs/client/sdk.py` `launch` does before it talks to the server."""
        dag = dag_utils.convert_entrypoint_to_dag(task)
        if name is not None:
            dag.name = name
        return {
            "body": payloads.JobsLaunchBody(task=dag_utils.dump_dag_to_yaml_str(dag), name=name)
        }

    def _jobs_launch(self, body: Any) -> tuple[list[int], None]:
        """The server's side: the DAG loaded from the YAML the client sent."""
        loaded = dag_utils.load_dag_from_yaml_str(body.task)
        primary = set(loaded.primary_tasks or []) if loaded.is_job_group() else None
        tasks = []
        for one in loaded.tasks:
            recovery = next(iter(one.resources)).job_recovery or {}
            first = next(iter(one.resources))
            codes = recovery.get("recover_on_exit_codes") or []
            tasks.append(
                FakeTask(
                    name=str(one.name),
                    primary=None if primary is None else (not primary or one.name in primary),
                    max_restarts=int(recovery.get("max_restarts_on_errors") or 0),
                    recover_codes=[codes] if isinstance(codes, int) else list(codes),
                    cloud=str(first.cloud) if first.cloud is not None else None,
                    region=first.region,
                )
            )
        job_id = self._next_id()
        self.jobs[job_id] = FakeJob(job_id, str(body.name or loaded.name), loaded, body.task, tasks)
        return [job_id], None

    def _jobs_queue_v2(self, **kw: Any) -> tuple[list[Any], int, dict[str, int], int, list[str]]:
        """The server's `queue_v2`: one record per task, filtered as the server filters."""
        every = [(job, n, t) for job in self.jobs.values() for n, t in enumerate(job.tasks)]
        for job, _n, one in every:
            if kw["job_ids"] is None or job.job_id in kw["job_ids"]:
                self._advance(job, one)
        found = [
            (job, n, t)
            for job, n, t in every
            if (kw["job_ids"] is None or job.job_id in kw["job_ids"])
            and not (kw["skip_finished"] and not job.live)
            and (kw["name_match"] is None or kw["name_match"] in job.name)
            and (kw["statuses"] is None or t.status.value in kw["statuses"])
        ]
        found.sort(key=lambda item: (-item[0].job_id, item[1]))
        found = found[: kw["limit"] or None]
        keep = None if kw["fields"] is None else set(kw["fields"]) | {"job_id", "task_id", "status"}
        records = [_record(job, n, one) for job, n, one in found]
        models = [
            responses.ManagedJobRecord(**{k: v for k, v in r.items() if keep is None or k in keep})
            for r in records
        ]
        counts = Counter(one.status.value for _job, _n, one in found)
        return models, len(found), dict(counts), len(every), []

    def _jobs_cancel(self, name: str | None, job_ids: Any, **kw: Any) -> None:
        """`sky/jobs/server/core.py` `cancel` → `sky/jobs/utils.py` (see the module docstring)."""
        chosen = [bool(job_ids), name is not None, kw["pool"] is not None, kw["all"]]
        if sum(chosen) + bool(kw["all_users"] and not kw["all"]) != 1:
            raise ValueError("Can only specify one of JOB_IDS, name, pool, or all/all_users.")
        body = payloads.JobsCancelBody(name=name, job_ids=job_ids, all=kw["all"])
        if body.name is not None:
            live = [j.job_id for j in self.jobs.values() if j.name == body.name and j.live]
            if not live:
                self.messages.append(f"No running job found with name {body.name!r}.")
            elif len(live) > 1:
                self.messages.append(
                    f"Multiple running jobs found with name {body.name!r}.\nJob IDs: {live}"
                )
            else:
                self.messages.append(f"{body.name!r} {self._cancel_ids(live)}")
            return None
        ids = [j for j in self.jobs if self.jobs[j].live] if body.all else body.job_ids or []
        self.messages.append(self._cancel_ids(list(ids)))
        return None

    def _cancel_ids(self, job_ids: list[int]) -> str:
        done = []
        for job_id in dict.fromkeys(job_ids):
            job = self.jobs.get(job_id)
            if job is None or not job.live:
                continue
            for n, one in enumerate(job.tasks):
                if one.status is S.PENDING:
                    self._enter(one, S.CANCELLED)
                elif not one.status.is_terminal():
                    self._enter(one, S.CANCELLING)
                    self._cancelling[(job_id, n)] = self.cancel_polls
                one.script.clear()
            done.append(job_id)
        if not done:
            return "No job to cancel."
        if len(done) == 1:
            return f"Job with ID {done[0]} is scheduled to be cancelled."
        return f"Jobs with IDs {', '.join(map(str, done))} are scheduled to be cancelled."

    def _jobs_tail_logs(self, job_id: int | None, name: str | None, task: Any, **_kw: Any) -> Any:
        key = job_id if job_id is not None else str(name)
        text = self.logs.get((key, task), self.logs.get((key, None), ""))
        return _chunks(text)

    # ------------------------------------------------------------------ clusters

    def _status(self, cluster_names: list[str] | None, **_kw: Any) -> list[Any]:
        names = [n for n in cluster_names or self.clusters if n in self.clusters]
        return [responses.StatusResponse.model_validate(self.clusters[n]["record"]) for n in names]

    def _job_status(self, cluster_name: str, job_ids: list[int] | None, **_kw: Any) -> Any:
        cluster = self.clusters.get(cluster_name)
        if cluster is None:
            raise sx.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
        ids = job_ids or list(cluster["jobs"])
        return {i: cluster["jobs"].get(i) for i in ids}

    def _down_cluster(self, cluster_name: str, **_kw: Any) -> None:
        if self.clusters.pop(cluster_name, None) is None:
            raise sx.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")

    @staticmethod
    def _cluster_client(task: Any, body: type[Any], **fields: Any) -> dict[str, Any]:
        """What `sky/client/sdk.py` `launch` / `exec` do before they talk to the server."""
        dag = dag_utils.convert_entrypoint_to_dag(task)
        return {"body": body(task=dag_utils.dump_dag_to_yaml_str(dag), **fields)}

    def _launch_client(self, task: Any, cluster_name: str | None, **kw: Any) -> dict[str, Any]:
        fields = {k: kw[k] for k in ("idle_minutes_to_autostop", "down", "dryrun", "no_setup")}
        return self._cluster_client(task, payloads.LaunchBody, cluster_name=cluster_name, **fields)

    def _exec_client(self, task: Any, cluster_name: str | None, **kw: Any) -> dict[str, Any]:
        fields = {"dryrun": kw["dryrun"], "down": kw["down"]}
        return self._cluster_client(task, payloads.ExecBody, cluster_name=cluster_name, **fields)

    def _launch_cluster(self, body: Any) -> tuple[int, None]:
        """The server's `launch`: a cluster UP (or the existing one) with a new job on it."""

        (task,) = dag_utils.load_dag_from_yaml_str(body.task).tasks
        name = str(body.cluster_name)
        first = next(iter(task.resources))
        record = {
            "name": name, "launched_at": int(time.time()), "status": "UP",
            "autostop": -1 if body.idle_minutes_to_autostop is None
            else body.idle_minutes_to_autostop,
            "to_down": bool(body.down), "cluster_hash": "fake", "cluster_ever_up": True,
            "user_hash": "fake", "user_name": "fake", "workspace": "default",
            "is_managed": False, "nodes": task.num_nodes,
            "cloud": str(first.cloud) if first.cloud is not None else None,
            "region": first.region,
        }  # fmt: skip
        cluster = self.clusters.setdefault(name, {"record": record, "jobs": {}})
        return self._new_job(name, cluster, body.task), None

    def _exec(self, body: Any) -> tuple[int, None]:
        """The server's `exec`: a new job on a cluster that is UP (no setup, no provisioning)."""

        name = str(body.cluster_name)
        cluster = self.clusters.get(name)
        if cluster is None:
            raise sx.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if cluster["record"]["status"] != "UP":
            raise ValueError(f"Cluster {name!r} is not up.")
        return self._new_job(name, cluster, body.task), None

    def _new_job(self, name: str, cluster: dict[str, Any], yaml_text: str) -> int:
        """A PENDING job on a cluster, its task YAML kept, handed to `on_job` if set."""
        from sky.skylet import job_lib

        job_id = max(cluster["jobs"], default=0) + 1
        cluster["jobs"][job_id] = job_lib.JobStatus.PENDING
        self.cluster_yamls.setdefault(name, []).append(yaml_text)
        if self.on_job is not None:
            self.on_job(name, job_id, yaml_text)
        return job_id

    def _autostop(self, cluster_name: str, idle_minutes: int, down: bool, **_kw: Any) -> None:
        cluster = self.clusters.get(cluster_name)
        if cluster is None:
            raise sx.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
        cluster["record"].update(autostop=idle_minutes, to_down=down)

    def _tail_logs(self, cluster_name: str, job_id: int | None, **_kw: Any) -> Any:
        text = self.logs.get((cluster_name, job_id), self.logs.get((cluster_name, None), ""))
        return _chunks(text)

    # ------------------------------------------------------------------ the model

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
        if status is S.RUNNING and one.start_at is None:
            one.start_at = now
        if status.is_terminal():
            one.end_at = now
            one.script.clear()
        if status.is_failed() and reason is None:
            reason = f"{status.value} (set by the test)"
        if reason is not None:
            one.failure_reason = reason
        one.status = status


def _request_body(sent: dict[str, Any]) -> str:
    """A request's body as the server keeps it (`RequestPayload.request_body`): the payload the
    client sent (`jobs.launch`: its `JobsLaunchBody`, the task's YAML inside)."""
    body = sent.get("body")
    if hasattr(body, "model_dump_json"):
        return body.model_dump_json()
    return json.dumps({k: repr(v) for k, v in sent.items()})


def _record(job: FakeJob, n: int, one: FakeTask) -> dict[str, Any]:
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
    }


def _chunks(text: str, size: int = 17) -> Iterator[str | None]:
    """A log as `preload_content=False` streams it: odd-sized chunks, then None."""
    yield from (text[i : i + size] for i in range(0, len(text), size))
    yield None


def _wire(name: str, value: Any) -> Any:
    """`value` as the client gets it: the server's encoder, JSON, the client's decoder."""
    if inspect.isgenerator(value):
        return value  # a stream, not a request result
    full = server_constants.REQUEST_NAME_PREFIX + name
    encoded = encoders.get_encoder(full)(value)
    return decoders.get_decoder(full)(json.loads(json.dumps(encoded)))


_MODULES = {"": (sky, client_sdk), "jobs.": (sky.jobs, jobs_sdk)}
_SDK_MODULES = {client_sdk.__name__, jobs_sdk.__name__}


def _real(name: str) -> Any:
    """The real SDK function `name` (`launch`, `jobs.cancel`), as imported before any patch."""
    prefix, _, short = name.rpartition(".")
    return _ORIGINAL[prefix + "." if prefix else ""][short]


def _sdk_functions(module: Any) -> dict[str, Any]:
    """The public functions of `module` that come from SkyPilot's client SDK modules."""
    found = {}
    for attr in dir(module):
        value = getattr(module, attr, None)
        if attr.startswith("_") or not inspect.isfunction(inspect.unwrap(value)):
            continue
        if getattr(value, "__module__", None) in _SDK_MODULES:
            found[attr] = value
    return found


_ORIGINAL = {prefix: _sdk_functions(modules[0]) for prefix, modules in _MODULES.items()}
"""Captured when this module is imported, before any test patches the SDK."""


def _unfaked(name: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"unfaked SkyPilot call sky.{name}")

    return refuse


def install(monkeypatch: pytest.MonkeyPatch) -> FakeSky:
    """Patch SkyPilot's SDK with a new FakeSky (every public SDK function of `sky` and
    `sky.jobs`, in the package and in the SDK module it comes from)."""
    fake = FakeSky()
    faked: dict[str, Callable[..., Any]] = {
        "launch": fake._request("launch", fake._launch_cluster, fake._launch_client),
        "exec": fake._request("exec", fake._exec, fake._exec_client),
        "autostop": fake._request("autostop", fake._autostop),
        "status": fake._request("status", fake._status),
        "job_status": fake._request("job_status", fake._job_status),
        "down": fake._request("down", fake._down_cluster),
        "tail_logs": fake._stream("tail_logs", fake._tail_logs),
        "get": fake.get,
        "stream_and_get": fake.stream_and_get,
        "jobs.launch": fake._request("jobs.launch", fake._jobs_launch, fake._jobs_launch_client),
        "jobs.queue_v2": fake._request("jobs.queue_v2", fake._jobs_queue_v2),
        "jobs.cancel": fake._request("jobs.cancel", fake._jobs_cancel),
        "jobs.tail_logs": fake._stream("jobs.tail_logs", fake._jobs_tail_logs),
        "api_status": fake._stream("api_status", fake._api_status),
    }
    real_status = server_common.get_api_server_status

    def api_server_status(*args: Any, **kwargs: Any) -> Any:
        inspect.signature(real_status).bind(*args, **kwargs)
        up = server_common.ApiServerStatus.UNHEALTHY if fake._down else None
        return server_common.ApiServerInfo(status=up or server_common.ApiServerStatus.HEALTHY)

    monkeypatch.setattr(server_common, "get_api_server_status", api_server_status)
    for prefix, modules in _MODULES.items():
        for attr in _sdk_functions(modules[0]):
            replacement = faked.get(prefix + attr) or _unfaked(prefix + attr)
            for module in modules:
                if hasattr(module, attr):
                    monkeypatch.setattr(module, attr, replacement)
    return fake


def strict_records(model: Any, raw: list[dict[str, Any]]) -> list[Any]:
    """`raw` read into SkyPilot's response `model`, refusing a key the model does not have:
    SkyPilot's models ignore unknown keys (`extra='ignore'`), so a field SkyPilot renamed
    would otherwise pass unnoticed as a missing value."""
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    for record in raw:
        unknown = sorted(set(record) - known)
        if unknown:
            raise AssertionError(f"{model.__name__} has no field {', '.join(unknown)}")
    return [model.model_validate(record) for record in raw]
