"""`mncloud doctor --bandwidth RUN` on a live local run: the preflight's all-reduce bandwidth
test (`mncloud.doctor.bandwidth`) once more across the run's nodes, on a free port (the run's
own rendezvous port is torchrun's), held against the expectation its task was rendered with."""

from __future__ import annotations

import os
import subprocess
import sys

from mncloud import constants, layout
from mncloud.backends.local.processes import free_port
from mncloud.backends.local.state import load_launch
from mncloud.render.bandwidth import recorded_expectation


def measure(run_name: str, min_bandwidth: float | None, timeout: float) -> tuple[bool, list[str]]:
    """(passed, the lines node 0 printed) of the test across run `run_name`'s local nodes."""
    launch = load_launch(layout.run_dir(run_name))
    nodes, port = launch.num_nodes, free_port()
    args = ["--bandwidth", "--timeout", str(timeout), "--workdir", launch.workdir]
    expected = recorded_expectation(launch.run)
    if expected:
        args += ["--expect-busbw", f"{expected[0]:g}", "--fabric", expected[1]]
    if min_bandwidth is not None:
        args += ["--min-bandwidth", str(min_bandwidth)]
    procs = [_start(rank, nodes, port, args) for rank in range(nodes)]
    outputs = [proc.communicate(timeout=timeout + 60)[1] for proc in procs]
    passed = all(proc.returncode == 0 for proc in procs)
    lines = [x for x in outputs[0].splitlines() if x.startswith("preflight")]
    return passed, lines


def _start(rank: int, nodes: int, port: int, args: list[str]) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        constants.SKYPILOT_NODE_RANK: str(rank),
        constants.SKYPILOT_NUM_NODES: str(nodes),
        constants.SKYPILOT_NODE_IPS: "\n".join(["127.0.0.1"] * nodes),
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    for key in ("NCCL_SOCKET_IFNAME", constants.RUN_ID_ENV):
        env.pop(key, None)  # a second measurement never overwrites the run's own figure
    cmd = [sys.executable, "-m", "mncloud.doctor", "node", "--port", str(port), *args]
    return subprocess.Popen(
        cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
