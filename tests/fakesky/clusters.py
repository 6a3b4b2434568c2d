"""The fake server's clusters (`up --cluster`, `exec`): `launch`, `exec`, `status`,
`job_status`, `down`, `autostop`, `tail_logs` (a mixin of `FakeSky`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sky import exceptions as sx
from sky.schemas.api import responses
from sky.server.requests import payloads
from sky.utils import dag_utils

from tests.fakesky.model import chunks


class Clusters:
    """The clusters half of the fake API server."""

    clusters: dict[str, dict[str, Any]]
    cluster_yamls: dict[str, list[str]]
    logs: dict[tuple[int | str, str | int | None], str]
    on_job: Callable[[str, int, str], object] | None

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
            "name": name, "launched_at": int(self.now()), "status": "UP",
            "autostop": -1 if body.idle_minutes_to_autostop is None
            else body.idle_minutes_to_autostop,
            "to_down": bool(body.down), "cluster_hash": "fake", "cluster_ever_up": True,
            "user_hash": "fake", "user_name": "fake", "workspace": "default",
            "is_managed": False, "nodes": task.num_nodes,
            "cloud": str(first.cloud) if first.cloud is not None else None,
            "region": first.region,
        }  # fmt: skip
        cluster = self.clusters.setdefault(name, {"record": record, "jobs": {}})
        # `sky launch -c` onto a cluster that is up resets its launch time too (SkyPilot's
        # FIXME in `global_user_state.add_or_update_cluster`: `is_launch` defaults to True)
        cluster["record"]["launched_at"] = record["launched_at"]
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
        return chunks(text)
