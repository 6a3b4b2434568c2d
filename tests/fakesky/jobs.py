"""The fake server's managed jobs: `jobs.launch`, `jobs.queue_v2`, `jobs.cancel`,
`jobs.tail_logs`, as `sky/jobs/server/core.py` answers them (a mixin of `FakeSky`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from sky import exceptions as sx
from sky.jobs import ManagedJobStatus as S
from sky.schemas.api import responses
from sky.server import common as server_common
from sky.server.requests import payloads
from sky.skylet import constants
from sky.utils import dag_utils

from tests.fakesky.auth import Auth
from tests.fakesky.model import FakeJob, FakeTask, JobModel, User, chunks, record


def no_cloud_access() -> sx.NoCloudAccessError:
    """What a launch fails with on a server with no cloud enabled (`sky/check.py`)."""
    import colorama

    return sx.NoCloudAccessError(
        f"Cloud access is not set up. Run: {colorama.Style.BRIGHT}sky check"
        f"{colorama.Style.RESET_ALL}"
    )


def no_jobs_controller() -> sx.ClusterNotUpError:
    """What `jobs.queue_v2` and `jobs.cancel` fail with where no managed job was ever launched:
    there is no jobs controller to ask (`backend_utils.is_controller_accessible`)."""
    from sky.utils import controller_utils

    hint = controller_utils.Controllers.JOBS_CONTROLLER.value.default_hint_if_non_existent
    return sx.ClusterNotUpError(hint)


class ManagedJobs(JobModel, Auth):
    """The managed-jobs half of the fake API server."""

    user: User
    messages: list[str]
    logs: dict[tuple[int | str, str | int | None], str]
    cancel_polls: int
    cloud_access: bool
    _job_token: Callable[[int, User, list[Any]], None]

    @staticmethod
    def _jobs_launch_client(task: Any, name: str | None, **_rest: Any) -> dict[str, Any]:
        """What `sky/jobs/client/sdk.py` `launch` does before it talks to the server: the
        DAG, its name, and for a task with `api_server_access` the endpoint this client
        reaches the server at (`SKYPILOT_API_SERVER_ENDPOINT`, unless the server is local)."""
        dag = dag_utils.convert_entrypoint_to_dag(task)
        if name is not None:
            dag.name = name
        endpoint = server_common.get_server_url()
        if not server_common.is_api_server_local(endpoint):
            for one in dag.tasks:
                if one.api_server_access:
                    one.update_envs({constants.SKY_API_SERVER_URL_ENV_VAR: endpoint})
        return {
            "body": payloads.JobsLaunchBody(task=dag_utils.dump_dag_to_yaml_str(dag), name=name)
        }

    def _jobs_launch(self, body: Any) -> tuple[list[int], None]:
        """The server's side: the DAG loaded from the YAML the client sent, owned by the user
        who sent it; none at all without a cloud (`cloud_access`)."""
        if not self.cloud_access:
            raise no_cloud_access()
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
        name = str(body.name or loaded.name)
        # What the server keeps as `original_user_yaml_content`: the YAML the user specified,
        # secrets redacted (`sky/jobs/server/core.py`: `use_user_specified_yaml=True`).
        kept = dag_utils.dump_dag_to_yaml_str(loaded, use_user_specified_yaml=True)
        self.jobs[job_id] = FakeJob(
            job_id, name, loaded, kept, tasks, submitted_at=self.now(), user=self._caller()
        )
        self._job_token(job_id, self._caller(), loaded.tasks)  # `tokens.py`
        return [job_id], None

    def _jobs_queue_v2(self, **kw: Any) -> tuple[list[Any], int, dict[str, int], int, list[str]]:
        """The server's `queue_v2`: one record per task, filtered as the server filters; a
        user sees only the jobs they launched unless `all_users` (`sky/jobs/server/core.py`:
        `user_hashes = [common_utils.get_user_hash()]`); no jobs controller yet (no job ever
        launched): `ClusterNotUpError`, as the server answers."""
        if not self.jobs:
            raise no_jobs_controller()
        me = self._caller().user_hash
        mine = [j for j in self.jobs.values() if kw["all_users"] or j.user.user_hash == me]
        every = [(job, n, t) for job in mine for n, t in enumerate(job.tasks)]
        for job in self.jobs.values():  # time passes for every job, seen or not
            if kw["job_ids"] is None or job.job_id in kw["job_ids"]:
                for one in job.tasks:
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
        records = [record(job, n, one, self.now()) for job, n, one in found]
        models = [
            responses.ManagedJobRecord(**{k: v for k, v in r.items() if keep is None or k in keep})
            for r in records
        ]
        counts = Counter(one.status.value for _job, _n, one in found)
        return models, len(found), dict(counts), len(every), []

    def _jobs_cancel(self, name: str | None, job_ids: Any, **kw: Any) -> None:
        """`sky/jobs/server/core.py` `cancel` → `sky/jobs/utils.py` (see the package docstring):
        by id, any user's job (the workspace is the boundary); by name or `all`, the caller's;
        no jobs controller yet: `ClusterNotUpError`, as the server answers."""
        if not self.jobs:
            raise no_jobs_controller()
        me = self._caller().user_hash
        chosen = [bool(job_ids), name is not None, kw["pool"] is not None, kw["all"]]
        if sum(chosen) + bool(kw["all_users"] and not kw["all"]) != 1:
            raise ValueError("Can only specify one of JOB_IDS, name, pool, or all/all_users.")
        body = payloads.JobsCancelBody(name=name, job_ids=job_ids, all=kw["all"])
        if body.name is not None:
            live = [
                j.job_id for j in self.jobs.values()
                if j.name == body.name and j.live and j.user.user_hash == me
            ]  # fmt: skip
            if not live:
                self.messages.append(f"No running job found with name {body.name!r}.")
            elif len(live) > 1:
                self.messages.append(
                    f"Multiple running jobs found with name {body.name!r}.\nJob IDs: {live}"
                )
            else:
                self.messages.append(f"{body.name!r} {self._cancel_ids(live)}")
            return None
        if body.all or kw["all_users"]:
            ids = [
                j for j, job in self.jobs.items()
                if job.live and (kw["all_users"] or job.user.user_hash == me)
            ]  # fmt: skip
        else:
            ids = body.job_ids or []
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
        return chunks(text)
