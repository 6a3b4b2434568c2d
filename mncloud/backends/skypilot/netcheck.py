"""`mncloud doctor --bandwidth RUN` on a live cluster (`up --cluster`): the preflight's
all-reduce test alone, handed to the cluster's own nodes with `sky.exec` (no provisioning, no
setup, no training: `render/bandwidth.py`), its lines read back from the job's log.

The cluster must be idle (a training job's all-reduces would share the network and the GPUs
with the test); the measurement is a job of its own on it, which also restarts its idle timer.
A managed job's nodes take no other job: its preflight measured the figure at launch, and
`mncloud status RUN` shows it. Example:

    mncloud up train.py --cluster --nodes 4 --name dev     (trains; the cluster stays up)
    mncloud doctor --bandwidth dev
    preflight: all-reduce bus bandwidth 11.9 GB/s between 4 nodes (nccl), 95% of the …
"""

from __future__ import annotations

from typing import TextIO

from mncloud.backends.base import LaunchRequest
from mncloud.backends.skypilot.cluster import require_live_cluster
from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.logs import prefixed_lines
from mncloud.backends.skypilot.status import raw_state
from mncloud.backends.skypilot.task import build_task

#: Log lines kept for the answer when the job failed before any preflight line.
TAIL_ON_FAILURE = 5


def _needs(name: str) -> str:
    return (
        "`doctor --bandwidth` measures on the idle nodes of a cluster kept up by `up --cluster` "
        f"(a managed job's own preflight measured it at launch: `mncloud status {name}`)"
    )


def measure(
    name: str, minimum: float | None, timeout: float, progress: TextIO
) -> tuple[bool, list[str]]:
    """(passed, the preflight's lines) of the bandwidth test across run `name`'s cluster."""
    import sky

    from mncloud.records.store import load_current
    from mncloud.render import rendered_from_yaml
    from mncloud.render.bandwidth import bandwidth_task
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import LaunchOptions

    require_live_cluster(name, _needs(name))
    record = load_current(name)
    spec = JobSpec.model_validate(record.spec)
    options = LaunchOptions.model_validate(record.launch_options or {})
    recorded = rendered_from_yaml(record.task_yaml)
    task = bandwidth_task(
        spec, recorded, minimum=minimum, timeout=timeout, template=options.template
    )
    request = LaunchRequest(spec=spec, task=task, options=options)
    with sky_errors(f"measure the network of cluster {name}"):
        job_id, _handle = sky.stream_and_get(
            sky.exec(build_task(request), cluster_name=name), output_stream=progress
        )
        chunks = sky.tail_logs(name, job_id, follow=True, preload_content=False)
        lines = list(prefixed_lines(chunks, None))
        states = sky.get(sky.job_status(name, [job_id])) or {}
    state = raw_state(states.get(job_id)) if states.get(job_id) is not None else "UNKNOWN"
    return state == "SUCCEEDED", _answer(lines, f"job {job_id} on {name}: {state}")


def _answer(lines: list[str], outcome: str) -> list[str]:
    """Node 0's preflight lines and any node's failure, once each; else the job's outcome
    and the log's tail (it failed before the test said anything)."""
    kept: list[str] = []
    for line in lines:
        node, _, text = line.partition("] ")
        mine = node == "[node 0" and text.startswith("preflight")
        if (mine or text.startswith("preflight failed")) and text not in kept:
            kept.append(text)
    if not kept:
        kept = [f"the bandwidth test printed no figure ({outcome}); its log ends:"]
        kept += [f"  {line}" for line in lines[-TAIL_ON_FAILURE:]]
    return kept
