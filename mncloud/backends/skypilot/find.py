"""A run's managed jobs found by the run's own id, and ended by job id: never by a name alone.

A job's name is the run's name, and SkyPilot lets several jobs share one (`sky jobs cancel -n`
then cancels nothing, silently); the run record's id (`MNCLOUD_RUN_ID`, in every task's envs)
is unique. `launched_jobs(name, run_id)` is what a launch of record `run_id` made: the queue's
jobs named `name` whose own YAML (SkyPilot keeps it as `user_yaml`) carries that run id, once
no launch request that names it is still in flight (the API server finishes a request whose
client died, so a job may appear after the client is gone). Example, a deadline controller
killed while its launch was being submitted, restarted on a fresh VM:

    t=0    the controller journals run id dl-…-a1b2c3, calls `sky.jobs.launch`, is killed
    t=1    the API server goes on with the request: managed job 14, PENDING
    t=90   the restarted controller: `launched_jobs("dl", "dl-…-a1b2c3")` waits for the
           request, then finds job 14 by the run id in its YAML (not job 9, also named dl,
           of an earlier run): adopted, nothing launched again

`job_states` tells which jobs are live; `cancel.py` cancels them by id and waits until
SkyPilot reports them terminal (CANCELLING is not: its cluster is still being cleaned up).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.status import ask_queue, raw_state
from mncloud.constants import CONTROL_STATE_URI_ENV, RUN_ID_ENV

#: The queue's fields a search by run id reads.
FIND_FIELDS = [
    "job_id", "job_name", "task_id", "task_name", "status", "user_yaml", "cloud", "region",
    "submitted_at",
]  # fmt: skip


def launch_request_name() -> str:
    """What the API server names a `sky.jobs.launch` request in `sky.api_status()`:
    `sky.jobs.launch` (`REQUEST_NAME_PREFIX` + the request's name, as
    `sky/server/requests/executor.py` schedules it), never the bare SDK name."""
    from sky.server.constants import REQUEST_NAME_PREFIX
    from sky.server.requests.request_names import RequestName

    return REQUEST_NAME_PREFIX + RequestName.JOBS_LAUNCH.value


@dataclass
class FoundJob:
    """One managed job of a run, as the queue lists it (a job group: one per job, all tasks)."""

    job_id: int
    statuses: list[str] = field(default_factory=list)
    """SkyPilot's state of each task, in task order."""
    tasks: list[str] = field(default_factory=list)
    """Task names in task order (a job group: the lighthouse first, then the nodes)."""
    cloud: str | None = None
    region: str | None = None

    @property
    def live(self) -> bool:
        """A task SkyPilot does not report ended (CANCELLING is live: it still tears down)."""
        from sky.jobs import ManagedJobStatus

        return any(not ManagedJobStatus(s).is_terminal() for s in self.statuses)


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def env_values(user_yaml: str | None, env: str) -> set[str]:
    """The values of `env` in the envs of a job's YAML, every document (task) of it."""
    import yaml

    if not user_yaml:
        return set()
    try:
        docs = list(yaml.safe_load_all(user_yaml))
    except yaml.YAMLError:
        return set()
    found = set()
    for doc in docs:
        envs = doc.get("envs") if isinstance(doc, dict) else None
        if isinstance(envs, dict) and envs.get(env):
            found.add(str(envs[env]))
    return found


def _queue(what: str, **query: Any) -> list[Any]:
    # every user's: the run id (or the ids) pick the run's own
    return ask_queue(what, all_users=True, **query)


def _grouped(records: Iterable[Any]) -> list[FoundJob]:
    """Queue records (one per task) → one FoundJob per job id, oldest job first."""
    jobs: dict[int, FoundJob] = {}
    known = [r for r in records if _field(r, "job_id") is not None]
    for record in sorted(known, key=lambda r: (_field(r, "job_id"), _field(r, "task_id") or 0)):
        job_id = int(_field(record, "job_id"))
        job = jobs.setdefault(job_id, FoundJob(job_id))
        job.statuses.append(raw_state(_field(record, "status")))
        job.tasks.append(str(_field(record, "task_name") or ""))
        job.cloud = job.cloud or _field(record, "cloud")
        job.region = job.region or _field(record, "region")
    return list(jobs.values())


def launched_jobs(name: str, run_id: str) -> list[FoundJob]:
    """The managed jobs a launch of record `run_id` made (see the module docstring)."""
    wait_for_launch_requests(run_id)
    return jobs_with_env(name, RUN_ID_ENV, [run_id])


def controller_jobs(name: str, state_uri: str) -> list[FoundJob]:
    """The deadline controller jobs of the run whose state is at `state_uri`."""
    return jobs_with_env(f"{name}-control", CONTROL_STATE_URI_ENV, [state_uri])


def jobs_with_env(name: str, env: str, values: Iterable[str]) -> list[FoundJob]:
    """The queue's jobs named `name` whose tasks carry `env` set to one of `values`, oldest
    first (none asked: none found)."""
    wanted = set(values)
    if not wanted:
        return []
    records = _queue(f"look for the managed jobs of {name}", name_match=name, fields=FIND_FIELDS)
    mine = [
        r for r in records
        if _field(r, "job_name") == name and wanted & env_values(_field(r, "user_yaml"), env)
    ]  # fmt: skip
    return _grouped(mine)


def jobs_named_exactly(name: str) -> list[FoundJob]:
    """Every user's managed jobs named exactly `name` (the queue's filter matches substrings)."""
    records = _queue(f"look for the managed jobs named {name}", name_match=name, fields=FIND_FIELDS)
    return _grouped(r for r in records if _field(r, "job_name") == name)


def controller_state_uris(name: str) -> list[str]:
    """Where the deadline controllers of run `name` (every `NAME-control` job SkyPilot lists,
    of any user) keep their state: what `down` from another machine starts from."""
    wanted = f"{name}-control"
    records = _queue(f"look for the controller of {name}", name_match=wanted, fields=FIND_FIELDS)
    uris: set[str] = set()
    for record in records:
        if _field(record, "job_name") == wanted:
            uris |= env_values(_field(record, "user_yaml"), CONTROL_STATE_URI_ENV)
    return sorted(uris)


def wait_for_launch_requests(run_id: str) -> None:
    """Wait for the API server's unfinished `jobs.launch` requests whose body names `run_id`
    (a failed one made nothing: its error is not ours to raise)."""
    import sky

    with sky_errors("list the SkyPilot API server's requests"):
        requests = sky.api_status(all_status=False)
    launch_name = launch_request_name()
    for request in requests:
        if request.name == launch_name and run_id in (request.request_body or ""):
            try:
                sky.get(request.request_id)
            except Exception:  # the launch failed: whatever it made, the queue lists
                continue


def launch_requests_naming(run_ids: Iterable[str]) -> list[str]:
    """The ids of the API server's unfinished `jobs.launch` requests whose body names one of
    `run_ids` (a dead controller's training launch: the server goes on with it)."""
    import sky

    wanted = [run_id for run_id in run_ids if run_id]
    if not wanted:
        return []
    with sky_errors("list the SkyPilot API server's requests"):
        requests = sky.api_status(all_status=False)
    launch_name = launch_request_name()
    return [
        str(r.request_id) for r in requests
        if r.name == launch_name and any(w in (r.request_body or "") for w in wanted)
    ]  # fmt: skip


def unfinished_requests(request_ids: Iterable[str]) -> list[str]:
    """Those of `request_ids` the API server has not finished (PENDING, WAITING, RUNNING);
    one it no longer lists is finished."""
    import sky
    from sky.server.requests.requests import RequestStatus

    ids = list(request_ids)
    if not ids:
        return []
    active = {status.value for status in RequestStatus.active_statuses()}
    with sky_errors(f"ask the SkyPilot API server about requests {', '.join(ids)}"):
        rows = sky.api_status(request_ids=ids)
    return [str(r.request_id) for r in rows if str(getattr(r.status, "value", r.status)) in active]


def settle_launch_requests(
    run_ids: Iterable[str], *, wait_s: float, poll_s: float, sleep: Callable[[float], None]
) -> list[str]:
    """Wait up to `wait_s` (a look every `poll_s`) for the unfinished `jobs.launch` requests
    naming one of `run_ids`; the ids of those still unfinished then (none: each ended, and
    whatever it made the queue lists). Looks are counted, not timed: `sleep` is the clock."""
    return settle_requests(launch_requests_naming(run_ids), wait_s=wait_s, poll_s=poll_s,
                           sleep=sleep)  # fmt: skip


def settle_requests(
    request_ids: Iterable[str], *, wait_s: float, poll_s: float, sleep: Callable[[float], None]
) -> list[str]:
    """Wait up to `wait_s` (a look every `poll_s`, `sleep` between) for the API server to
    finish `request_ids`; those still unfinished then."""
    from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_fixed

    flying = list(request_ids)
    if not flying:
        return []
    looks = Retrying(
        stop=stop_after_attempt(1 + math.ceil(wait_s / poll_s)),
        wait=wait_fixed(poll_s),
        retry=retry_if_result(bool),
        retry_error_callback=lambda last: last.outcome.result() if last.outcome else flying,
        sleep=sleep,
    )
    return list(looks(unfinished_requests, flying))


def job_states(job_ids: Iterable[int]) -> dict[int, FoundJob]:
    """The queue's view of `job_ids` (a job it no longer lists is left out)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    records = _queue(
        f"get the status of managed jobs {ids}",
        job_ids=ids,
        fields=["job_id", "task_id", "task_name", "status"],
    )
    return {job.job_id: job for job in _grouped(records) if job.job_id in ids}


def launches_in_flight(job_name: str, *, wait: bool = False) -> list[str]:
    """The ids of the API server's unfinished `jobs.launch` requests of a job named exactly
    `job_name` (an `up` interrupted while it launched `NAME-control`: the server goes on with
    it); `wait`: wait for each to finish first (a failed one made nothing)."""
    import json

    import sky

    with sky_errors("list the SkyPilot API server's requests"):
        requests = sky.api_status(all_status=False)
    found = []
    for request in requests:
        if request.name != launch_request_name():
            continue
        try:
            body = json.loads(request.request_body or "{}")
        except ValueError:
            continue
        if isinstance(body, dict) and body.get("name") == job_name:
            found.append(str(request.request_id))
    for request_id in found if wait else []:
        try:
            sky.get(request_id)
        except Exception:  # the launch failed: whatever it made, the queue lists
            continue
    return found
