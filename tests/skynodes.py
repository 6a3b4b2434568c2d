"""A SkyPilot cluster's nodes as local processes: what a cluster does with a task it was sent.

`start(yaml_text)` runs the `run` of the task SkyPilot's server received (the YAML of its DAG,
as `tests/fakesky.py` keeps it) on `num_nodes` local processes, each with the environment
SkyPilot gives a node: `SKYPILOT_NODE_IPS` (N × 127.0.0.1), `SKYPILOT_NODE_RANK`,
`SKYPILOT_NUM_NODES`, `SKYPILOT_NUM_GPUS_PER_NODE`, `SKYPILOT_TASK_ID`, the task's `envs`, in
its workdir. Their output is gathered as SkyPilot's job log prefixes it:
`(head, rank=0, pid=…) text`, `(worker1, rank=1, pid=…) text`. Only the cloud's API that
makes VMs is faked; what runs on the "nodes" is the real task. Example:

    fake_sky.on_job = cluster_jobs(fake_sky)      # every launch / exec on a cluster runs
    nodes = start(job.yaml, env=s3_credentials)   # a managed job's task, killed at will
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mncloud import constants

if TYPE_CHECKING:
    from tests.fakesky import FakeSky


@dataclass
class Nodes:
    """The node processes of one job, and their output as SkyPilot's log has it."""

    procs: list[subprocess.Popen[bytes]]
    lines: list[str] = field(default_factory=list)
    _pumps: list[threading.Thread] = field(default_factory=list)

    def wait(self, timeout: float = 180.0) -> list[int]:
        """Every node's exit code, once all have ended (their output gathered)."""
        codes = [proc.wait(timeout) for proc in self.procs]
        for pump in self._pumps:
            pump.join(10)
        return codes

    def kill(self) -> None:
        """The VMs are gone (a preemption): every process of every node killed at once
        (torchrun starts its workers in sessions of their own: walked, not signalled)."""
        import psutil

        doomed: list[psutil.Process] = []
        for proc in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                node = psutil.Process(proc.pid)
                doomed += [node, *node.children(recursive=True)]
        for one in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):
                one.kill()
        psutil.wait_procs(doomed, timeout=30)
        self.wait(30)

    @property
    def log(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def start(
    yaml_text: str, *, task_id: str, gpus_per_node: int = 0, env: dict[str, str] | None = None
) -> Nodes:
    """Start the task's `run` on its nodes (module docstring)."""
    from sky.utils import dag_utils

    task = dag_utils.load_dag_from_yaml_str(yaml_text).tasks[0]
    count = task.num_nodes
    common = {
        **os.environ,
        **(env or {}),
        **{k: str(v) for k, v in (task.envs or {}).items()},
        constants.SKYPILOT_NODE_IPS: "\n".join(["127.0.0.1"] * count),
        constants.SKYPILOT_NUM_NODES: str(count),
        constants.SKYPILOT_NUM_GPUS_PER_NODE: str(gpus_per_node),
        constants.SKYPILOT_TASK_ID: task_id,
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    cwd = task.workdir if isinstance(task.workdir, str) else tempfile.mkdtemp(prefix="skynode-")
    nodes = Nodes([])
    for rank in range(count):
        proc = subprocess.Popen(
            ["/bin/bash", "-c", task.run],
            cwd=cwd,
            env={**common, constants.SKYPILOT_NODE_RANK: str(rank)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        nodes.procs.append(proc)
        label = "head" if rank == 0 else f"worker{rank}"
        pump = threading.Thread(
            target=_pump,
            args=(proc, f"({label}, rank={rank}, pid={proc.pid}) ", nodes.lines),
            daemon=True,
        )
        pump.start()
        nodes._pumps.append(pump)
    return nodes


def _pump(proc: subprocess.Popen[bytes], prefix: str, lines: list[str]) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        lines.append(prefix + raw.decode(errors="replace").rstrip("\n"))
    proc.stdout.close()


def cluster_jobs(fake: FakeSky, **kwargs: Any) -> Callable[[str, int, str], None]:
    """A `FakeSky.on_job` that runs each job sent to a cluster to its end, there and then:
    its state SUCCEEDED or FAILED by the nodes' exit codes, its log in `fake.logs`."""
    from sky.skylet import job_lib

    def on_job(cluster: str, job_id: int, yaml_text: str) -> None:
        nodes = start(yaml_text, task_id=f"sky-{cluster}-{job_id}", **kwargs)
        codes = nodes.wait()
        ok = all(code == 0 for code in codes)
        fake.clusters[cluster]["jobs"][job_id] = (
            job_lib.JobStatus.SUCCEEDED if ok else job_lib.JobStatus.FAILED
        )
        fake.logs[(cluster, job_id)] = nodes.log

    return on_job
