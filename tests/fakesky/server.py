"""`FakeSky`: the fake API server's requests (bound to the real SDK, recorded, answered through
the wire, kept in flight, failed or lost on demand) and `install`, which patches the SDK."""

from __future__ import annotations

import inspect
import json
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import pytest
from sky import exceptions as sx
from sky.jobs import ManagedJobStatus as S
from sky.schemas.api import responses
from sky.server import common as server_common
from sky.server import constants as server_constants
from sky.server.requests import payloads

from tests.fakesky.auth import stamped
from tests.fakesky.clusters import Clusters
from tests.fakesky.jobs import ManagedJobs
from tests.fakesky.model import LAPTOP, Event, FakeJob, FakeTask, User, request_body
from tests.fakesky.tokens import Tokens
from tests.fakesky.wire import (
    DAEMONS,
    MODULES,
    caller,
    real,
    sdk_functions,
    server_name,
    unfaked,
    wire,
    wire_error,
)

_MODEL = object()
_LONG = {"launch", "exec", "down", "jobs.launch"}
"""Calls the server schedules as long requests (`ScheduleType.LONG`)."""


def cancelled(row: dict[str, Any]) -> str:
    """What the real client's `sky.get` says of a request cancelled by `sky.api_cancel`."""
    import colorama

    return (
        f"{colorama.Fore.YELLOW}Current {row['name']!r} request ({row['request_id']}) is "
        f"cancelled by another process.{colorama.Style.RESET_ALL}"
    )


INSTALLED: FakeSky | None = None
"""The fake `install` put in place for the running test (a driver sets its `clock`)."""


class FakeSky(ManagedJobs, Clusters, Tokens):
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
        """Queue reads a cancelled live task stays CANCELLING before it is CANCELLED (a slow
        teardown: set it high)."""
        self.clock: Callable[[], float] | None = None
        """The server's clock for the jobs' times (a test's fake clock); None: `time.time`."""
        self.user: User = LAPTOP
        """Who the client is to the server (`as_user`): the owner of the jobs it launches."""
        self.tokens: dict[str, User] = {}
        """Service-account tokens (`service_account`): none, a server without logins."""
        self.admins: set[str] = set()
        self._results: dict[str, tuple[str, Any]] = {}
        self._down_after: str | None = None
        self._down = False
        self._cancelling: dict[tuple[int, int], int] = {}
        self.held: set[str] = set()
        """Call names whose requests stay in flight (until waited for, or `finish_after`)."""
        self.finish_after: int | None = None
        """A request in flight finishes on its own once this many later requests reached the
        server (a real server goes on with a request whose client died); None: only when
        someone waits for it."""
        self._in_flight: dict[str, tuple[str, str, Callable[[], Any], int]] = {}
        self._failing: dict[str, deque[BaseException]] = {}
        self._losing: Counter[str] = Counter()
        self.health: dict[str, Any] = {}
        """Fields of the server's `/api/health` answer (`sky.api_info`) over a plain one of this
        SkyPilot's version (`api_info`): `{"basic_auth_enabled": True}`..."""
        self.cloud_access = True
        """False: no cloud is enabled on the server, and every launch fails there as the real
        server's does (`NoCloudAccessError`, `sky/check.py`)."""
        self._tokens_init()
        self._ledger: dict[str, dict[str, Any]] = {}
        """Every request the server got, as `sky.api_status` lists it (`RequestPayload`'s
        fields): name, user, body, status, times."""

    # ------------------------------------------------------------------ test controls

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for n, args, kwargs in self.calls if n == name]

    def job(self, job_id: int) -> FakeJob:
        return self.jobs[job_id]

    def add_job(
        self,
        name: str,
        status: S = S.RUNNING,
        tasks: list[str] | None = None,
        user: User = LAPTOP,
    ) -> int:
        """A managed job launched by someone else (another machine, a controller VM)."""
        job_id = self._next_id()
        names = tasks or [name]
        group = len(names) > 1
        made = [FakeTask(t, status, True if group else None) for t in names]
        self.jobs[job_id] = FakeJob(job_id, name, None, "", made, self.now(), user=user)
        if status is S.RUNNING:
            for one in made:
                one.start_at = one.last_recovered_at = one.running_since = self.now()
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

    def as_user(self, user: User) -> None:
        """The client is `user` from now on (a controller VM with its own identity)."""
        self.user = user

    def fail(self, name: str, err: BaseException, times: int = 1) -> None:
        """The next `times` requests of call `name` fail on the server with `err` (nothing
        done): `sky.get` raises it, as it raises a request's error; a direct call
        (`api_status`, `tail_logs`) raises it at once."""
        self._failing.setdefault(name, deque()).extend([err] * times)

    def lose(self, name: str, times: int = 1) -> None:
        """The answers of the next `times` requests of call `name` are lost: the server does
        the work, the client waiting for it gets `ApiServerConnectionError` (a later `sky.get`
        of the same request id has the answer, which the server kept)."""
        self._losing[name] += times

    def finish_in_flight(self) -> None:
        """The server finishes every request in flight (its client gone or not)."""
        for request_id in list(self._in_flight):
            self._finish(request_id)

    def running_seconds(self, job_id: int) -> list[float]:
        """Per task, the seconds VMs ran it up to now (what the cloud bills: `FakeTask`)."""
        now = self.now()
        return [
            t.running_s + (now - t.running_since if t.running_since is not None else 0.0)
            for t in self.jobs[job_id].tasks
        ]

    def live_jobs(self, name: str | None = None) -> list[int]:
        """Ids of the jobs (named `name`) not yet terminal, whoever launched them."""
        return [j.job_id for j in self.jobs.values() if j.live and name in (None, j.name)]

    # ------------------------------------------------------------------ requests

    def _request(
        self, name: str, server: Callable[..., Any], client: Callable[..., Any] | None = None
    ) -> Callable[..., str]:
        """A faked SDK call: bound to the real signature, the client's own work done (`client`,
        whose errors raise at once, as the real client's), recorded, answered by `server` (or
        by `answers[name]`, or a failure from `fail`), its result kept for `sky.get` under a
        request id."""
        the_real = real(name)

        def call(*args: Any, **kwargs: Any) -> str:
            bound = inspect.signature(the_real).bind(*args, **kwargs)
            bound.apply_defaults()
            sent = client(**bound.arguments) if client is not None else bound.arguments
            self._check_reachable(name)
            self._time_passes()
            self.calls.append((name, args, kwargs))
            request_id = f"req-{len(self.calls)}-{name}"
            self._ledger[request_id] = self._payload(request_id, name, request_body(sent))
            answer = self.answers.get(name, _MODEL)
            failing = self._failing.get(name)
            if failing:
                answer = failing.popleft()

            def answer_it() -> Any:
                if answer is not _MODEL:
                    return answer
                try:
                    return wire(name, server(**sent))
                except Exception as err:  # the request fails: raised by sky.get
                    return err

            if name in self.held:
                left = self.finish_after if self.finish_after is not None else -1
                self._in_flight[request_id] = (name, request_body(sent), answer_it, left)
                return request_id
            self._store(request_id, name, answer_it())
            return request_id

        call.__wrapped__ = the_real  # type: ignore[attr-defined]
        return call

    def _time_passes(self) -> None:
        """One more request reached the server: those in flight count down to finishing."""
        for request_id, (name, body, answer_it, left) in list(self._in_flight.items()):
            if left == 0:
                self._finish(request_id)
            elif left > 0:
                self._in_flight[request_id] = (name, body, answer_it, left - 1)

    def _finish(self, request_id: str) -> None:
        name, _body, answer_it, _left = self._in_flight.pop(request_id)
        self._store(request_id, name, answer_it())

    def _store(self, request_id: str, name: str, value: Any) -> None:
        """The request ended with `value` (an exception: it failed), kept for `sky.get` as
        the client would decode it (`wire_error`)."""
        if isinstance(value, BaseException):
            value = wire_error(value)
        row = self._ledger[request_id]
        row["status"] = "FAILED" if isinstance(value, BaseException) else "SUCCEEDED"
        row["finished_at"] = time.time()
        self._results[request_id] = (name, value)

    def _payload(self, request_id: str, name: str, body: str) -> dict[str, Any]:
        """A new request's row, owned by the user the client process is (`_caller`: the
        logged-in user, written into the body's `env_vars` as the server does)."""
        user = self._caller()
        if self._auth_user() is not None:
            body = stamped(body, user)
        return {"request_id": request_id, "name": server_name(name), "request_body": body,
                "entrypoint": name.rpartition(".")[2], "status": "PENDING",
                "created_at": time.time(), "user_id": user.user_hash, "user_name": user.name,
                "return_value": "null", "error": "null", "pid": None, "finished_at": None,
                "schedule_type": "long" if name in _LONG else "short"}  # fmt: skip

    def _stream(self, name: str, server: Callable[..., Any]) -> Callable[..., Any]:
        """A faked streaming call (`tail_logs(preload_content=False)`): the chunks at once."""
        the_real = real(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(the_real).bind(*args, **kwargs)
            bound.apply_defaults()
            self._check_reachable(name)
            self.calls.append((name, args, kwargs))
            failing = self._failing.get(name)
            if failing:  # `fail`: a direct call raises at once (no request to get)
                raise failing.popleft()
            return server(**bound.arguments)

        call.__wrapped__ = the_real  # type: ignore[attr-defined]
        return call

    @property
    def server_url(self) -> str:
        """The API server the SDK would talk to (named in `ApiServerConnectionError`)."""
        return str(server_common.get_server_url())

    def _check_reachable(self, name: str = "get") -> None:
        if self._down:
            raise sx.ApiServerConnectionError(self.server_url)
        self._check_token(name)  # an expired token: 401 (`tokens.py`)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(real("get")).bind(*args, **kwargs)
        return self._result(bound.arguments["request_id"])

    def stream_and_get(self, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(real("stream_and_get")).bind(*args, **kwargs)
        request_id = bound.arguments["request_id"]
        if not self._visible(self._ledger.get(request_id) or {"user_id": None}):
            raise sx.ClientError(f"Failed to stream logs: Request {request_id!r} not found")
        return self._result(request_id)

    def _result(self, request_id: str) -> Any:
        self._check_reachable()
        if not self._visible(self._ledger.get(request_id) or {"user_id": None}):
            raise self._not_found(request_id)
        if request_id in self._in_flight:
            self._finish(request_id)
        name, value = self._results[request_id]
        if self._losing[name] > 0:
            self._losing[name] -= 1
            raise sx.ApiServerConnectionError(self.server_url)
        if self._down_after == name:
            self._down = True
        if isinstance(value, BaseException):
            raise value
        return value

    def api_info(self, *args: Any, **kwargs: Any) -> Any:
        """`sky.api_info()`: the server's health answer (`health` over a plain server of this
        SkyPilot's version: no auth, no service accounts, no user, and, as SkyPilot's default,
        `external_proxy_auth_enabled`), not a request."""
        import sky

        inspect.signature(real("api_info")).bind(*args, **kwargs)
        self._check_reachable("api_info")
        self.calls.append(("api_info", args, kwargs))
        fields = {"status": server_common.ApiServerStatus.HEALTHY.value,
                  "api_version": str(server_constants.API_VERSION), "version": sky.__version__,
                  "version_on_disk": sky.__version__, "commit": sky.__commit__,
                  "basic_auth_enabled": False, "service_account_token_enabled": bool(self.tokens),
                  "ingress_basic_auth_enabled": False, "user": self._health_user(),
                  "external_proxy_auth_enabled": True, **self.health}  # fmt: skip
        return responses.APIHealthResponse(**json.loads(json.dumps(fields)))

    def _api_status(self, request_ids: Any, all_status: bool, **_kw: Any) -> list[Any]:
        """The server's requests as `sky.api_status` lists them, newest first: named as the
        server names them (`sky.jobs.launch`), each its user's, the server's own daemons
        (user `skypilot-system`, RUNNING) among them; the finished ones only with
        `all_status`, or when asked for by id (`all_status` is ignored with `request_ids`,
        `sky/client/sdk.py`), FAILED where the request raised; with a login, scoped to the
        caller (`Auth`)."""
        rows = [*DAEMONS, *reversed(self._ledger.values())]
        return [
            payloads.RequestPayload(**self._shown(row))
            for row in rows
            if (request_ids is None or any(row["request_id"].startswith(r) for r in request_ids))
            and (all_status or request_ids is not None or row["status"] in ("PENDING", "RUNNING"))
            and self._visible(row)
        ]

    def _api_cancel(self, request_ids: Any, all_users: bool, **_kw: Any) -> list[str]:
        """`sky.api_cancel`: the unfinished requests named (or all), of the user the client
        says it is (`SKYPILOT_USER_ID`; every user's with `all_users`), end CANCELLED, nothing
        of them done; a logged-in non-admin's reach its own only (`role_filter`
        `force_caller_scope_cancel_body`). `sky.get` of one raises `RequestCancelled` as the
        real client words it (`sky/client/sdk.py` `get`)."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        owner = self._scope() or (None if all_users else caller(self.user).user_hash)
        done = []
        for request_id in list(self._in_flight):
            row = self._ledger[request_id]
            if request_ids is not None and request_id not in request_ids:
                continue
            if owner is not None and row["user_id"] != owner:
                continue
            del self._in_flight[request_id]
            row["status"], row["finished_at"] = "CANCELLED", time.time()
            self._results[request_id] = (row["name"], sx.RequestCancelled(cancelled(row)))
            done.append(request_id)
        return done


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeSky | None = None) -> FakeSky:
    """Patch SkyPilot's SDK with `fake`, else a new FakeSky (every public SDK function of
    `sky` and `sky.jobs`, in the package and in the SDK module it comes from); a fake installed
    again keeps its jobs and clusters (a run shared by a module's tests)."""
    fake = FakeSky() if fake is None else fake
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
        "api_cancel": fake._request("api_cancel", fake._api_cancel),
        "api_info": fake.api_info,
    }
    real_status = server_common.get_api_server_status

    def api_server_status(*args: Any, **kwargs: Any) -> Any:
        inspect.signature(real_status).bind(*args, **kwargs)
        up = server_common.ApiServerStatus.UNHEALTHY if fake._down else None
        return server_common.ApiServerInfo(status=up or server_common.ApiServerStatus.HEALTHY)

    monkeypatch.setattr(server_common, "get_api_server_status", api_server_status)
    monkeypatch.setattr(sys.modules[__name__], "INSTALLED", fake)
    for prefix, modules in MODULES.items():
        for attr in sdk_functions(modules[0]):
            replacement = faked.get(prefix + attr) or unfaked(prefix + attr)
            for module in modules:
                if hasattr(module, attr):
                    monkeypatch.setattr(module, attr, replacement)
    return fake
