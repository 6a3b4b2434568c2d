"""SkyPilot as a cloud deadline controller's host (`backends.base.ControllerHost`).

The controller is the managed job `NAME-control`, launched through the user's API server; the
training jobs it launches are found by the run id in their envs (`find.py`), cancelled by id
(`cancel.py`), given the stop notice through the bucket (`notice.py`), and a launch made by a
controller that died is written back as `skypilot.json` (`meta.py`). This class only routes
the `control/` package's questions there: SkyPilot stays inside `backends/skypilot`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from mncloud.backends.skypilot import cancel, find, notice
from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.meta import JOB_GROUP, MANAGED_JOB, RunMeta, load_meta, save_meta

if TYPE_CHECKING:
    from mncloud.backends.base import Adopted, HostJob, RunState, RunStatus


class SkyPilotHost:
    """SkyPilot's managed jobs queue as the controller host (see the module docstring)."""

    def api_server_url(self) -> str:
        from sky.server import common

        return str(common.get_server_url())

    def api_login(self) -> tuple[Any, int]:
        import sky
        from sky.server import constants as server_constants

        with sky_errors("ask SkyPilot's API server how it logs users in"):
            info = sky.api_info()
        return info, int(server_constants.MIN_API_ACCESS_API_VERSION)

    def launch_controller(
        self, run_name: str, config: dict[str, Any], secrets: dict[str, str]
    ) -> int | None:
        """An answer lost on the way is asked for again (`lost.resolve`), never taken for a
        failed launch: the server goes on with it (LaunchAnswerLost when it cannot say)."""
        import sky

        from mncloud.backends.skypilot.lost import lost_answer_errors, resolve

        task = sky.Task.from_yaml_config(config, secrets_overrides=list(secrets.items()))
        action, name = f"launch the deadline controller of {run_name}", f"{run_name}-control"
        with sky_errors(action):
            request_id = sky.jobs.launch(task, name=name)
        try:
            with sky_errors(action, keep=lost_answer_errors()):
                job_ids, _handle = sky.stream_and_get(request_id, output_stream=sys.stderr)
        except lost_answer_errors():
            return resolve(name, str(request_id), None)
        return int(job_ids[0]) if job_ids else None

    def may_ask(self) -> bool:
        return cancel.server_to_ask()[1]

    def jobs_named(self, name: str) -> list[HostJob]:
        return list(find.jobs_named_exactly(name))

    def jobs_with_env(self, name: str, env: str, values: Iterable[str]) -> list[HostJob]:
        return list(find.jobs_with_env(name, env, values))

    def controller_state_uris(self, name: str) -> list[str]:
        return find.controller_state_uris(name)

    def wait_for_launch_requests(self, run_id: str) -> None:
        find.wait_for_launch_requests(run_id)

    def launches_in_flight(self, job_name: str, *, wait: bool = False) -> list[str]:
        return find.launches_in_flight(job_name, wait=wait)

    def settle_launches(
        self, run_ids: Iterable[str], *, wait_s: float, poll_s: float,
        sleep: Callable[[float], None],
    ) -> list[str]:  # fmt: skip
        return find.settle_launch_requests(run_ids, wait_s=wait_s, poll_s=poll_s, sleep=sleep)

    def settle_requests(
        self, request_ids: Iterable[str], *, wait_s: float, poll_s: float,
        sleep: Callable[[float], None],
    ) -> list[str]:  # fmt: skip
        return find.settle_requests(request_ids, wait_s=wait_s, poll_s=poll_s, sleep=sleep)

    def job_states(self, job_ids: Iterable[int]) -> dict[int, HostJob]:
        return dict(find.job_states(job_ids))

    def job_status(self, job: HostJob, name: str, nodes: int, spot: bool) -> RunStatus:
        from mncloud.backends.skypilot.group import job_group_status
        from mncloud.backends.skypilot.status import managed_job_status

        meta = _job_meta(job, name, nodes, spot)
        return job_group_status(meta) if meta.kind == JOB_GROUP else managed_job_status(meta)

    def cancel(
        self,
        job_ids: Iterable[int],
        *,
        wait_s: float | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> list[int]:
        waits: dict[str, Any] = {"wait_s": wait_s, "sleep": sleep}
        return cancel.cancel_jobs(job_ids, **{k: v for k, v in waits.items() if v is not None})

    def give_notice(
        self, ckpt_uri: str, notice_s: float, state_of: Callable[[], RunState], by: str
    ) -> int | None:
        return notice.give_notice(ckpt_uri, notice_s, state_of, by)

    def withdraw_notice(self, ckpt_uri: str) -> None:
        notice.withdraw_notice(ckpt_uri)

    def launch_meta(self, run_name: str) -> dict[str, Any] | None:
        meta = load_meta(run_name)
        return None if meta is None else meta.model_dump(mode="json")

    def save_launch_meta(self, meta: Mapping[str, Any]) -> None:
        save_meta(RunMeta.model_validate(dict(meta)))

    def adopt(self, job: HostJob, launch: Adopted) -> None:
        choice = launch.choice
        save_meta(
            _job_meta(
                job,
                launch.name,
                launch.nodes,
                launch.spot,
                cloud=job.cloud or choice.get("cloud"),
                region=job.region or choice.get("region"),
                instance_type=choice.get("instance_type"),
                hourly_per_node=choice.get("hourly_per_node"),
                launched_at=launch.launched_at,
                ckpt_uri=launch.ckpt_uri,
            )
        )


def _job_meta(job: HostJob, name: str, nodes: int, spot: bool, **fields: Any) -> RunMeta:
    """The `RunMeta` of a job found in the queue (a job group by its tasks), with `fields`;
    a controller's launch: it counts the errors itself (`max_restarts` 0, `outcomes.py`)."""
    group = len(job.tasks) > 1
    return RunMeta(
        kind=JOB_GROUP if group else MANAGED_JOB,
        tasks=list(job.tasks) if group else [],
        name=name,
        nodes=nodes,
        spot=spot,
        job_id=job.job_id,
        max_restarts=0,
        **{"cloud": job.cloud, "region": job.region, **fields},
    )
