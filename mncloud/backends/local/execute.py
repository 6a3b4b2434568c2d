"""`mncloud exec` on this machine: the task again on a local run's own simulated nodes.

What `sky.exec` does on a cluster kept up, done to a run folder: the same nodes (their folders
under `nodes/`, the same rendezvous port), the logs appended to, no setup (it ran when the
nodes came up). The supervisor starts afresh with a new token and task id; the script's
`CheckpointManager.load()` resumes from the newest complete checkpoint unless the caller set
the checkpoints aside first (`exec --restart`). Nodes whose preflight passed when they came up
skip it (`constants.PREFLIGHT_PASSED_ENV`). On a `--cluster` run whose warm hosts still run
(`warm.py`), every worker is forked from its node's host, torch already imported; when they are
gone (idle time passed, `down`), the exec's own node hosts (`vm.py`) import torch afresh
and the run log says so. Example:

    mncloud up train.py --cloud local --nodes 2 --name dev     (fails on a typo at step 40)
    (fix the typo)
    mncloud exec dev          → attempt 1 again on nodes 0 and 1; resumes from step 40
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path

from mncloud import constants, layout
from mncloud.backends.base import LaunchRequest
from mncloud.backends.local import lifecycle
from mncloud.backends.local.processes import port_is_free
from mncloud.backends.local.state import (
    LOG_MARKS,
    RUN_LOG,
    LocalLaunch,
    load_launch,
    load_state,
    node_log,
)
from mncloud.backends.local.warm import HOSTS_FILE
from mncloud.errors import BackendError, SpecError

KEEP = ("nodes", RUN_LOG, LOG_MARKS, HOSTS_FILE)
"""What an exec keeps of the run folder besides what any launch keeps: the nodes' own
folders, the logs (appended to, as a cluster's job logs accumulate) and a `--cluster` run's
warm hosts."""


def exec_launch(request: LaunchRequest, fresh: LocalLaunch) -> LocalLaunch:
    """The launch.json of an exec: `fresh` (the request's, `launch_record`) on the run's
    recorded nodes and port, with no setup and no chaos; SpecError while the run still runs."""
    name = request.spec.name
    folder = layout.run_dir(name)
    old, state = load_launch(folder), load_state(folder)
    if lifecycle.launch_alive(folder):
        raise SpecError(
            f"run {name!r} is still {state.state.value} on its nodes; wait for it "
            f"(`mncloud logs {name} -f`) or stop it with `mncloud down {name}`, then exec"
        )
    if not port_is_free(old.master_port):
        raise BackendError(
            f"port {old.master_port} of run {name!r}'s nodes on 127.0.0.1 is in use (another "
            f"run may hold it); free it, or `mncloud up --name {name} --resume --master-port N`"
        )
    passed = all(_passed_preflight(folder, node) for node in range(old.num_nodes))
    return fresh.model_copy(
        update={
            "token": uuid.uuid4().hex[:12],
            "task_id": f"sky-{datetime.now():%Y-%m-%d-%H-%M-%S-%f}_{name}_exec",
            "num_nodes": old.num_nodes,
            "procs_per_node": old.procs_per_node,
            "master_port": old.master_port,
            "setup": None,  # ran when the nodes came up, as on a cluster
            "chaos_preempt_after": None,
            "envs": {**fresh.envs, constants.PREFLIGHT_PASSED_ENV: "1"} if passed else fresh.envs,
        }
    )


def _passed_preflight(folder: Path, node: int, head: int = 4 << 20) -> bool:
    """Whether `node` passed its preflight when it came up (its log's first lines say so)."""
    path = folder / node_log(node)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f"preflight ok on node {node}/".encode() in f.read(head)


def start_exec(request: LaunchRequest, launch: LocalLaunch) -> None:
    """Write the exec into the run folder (nodes and logs kept) and start its supervisor."""
    folder = layout.run_dir(request.spec.name)
    keep = (*lifecycle.KEEP, *KEEP, *(node_log(n) for n in range(launch.num_nodes)))
    lifecycle.prepare_run(folder, launch, request.task.yaml_text, keep=keep)
    lifecycle.start_supervised(folder)
