"""One simulated node: the environment SkyPilot would give it, and its logs.

A node is `bash run.sh` (or `setup.sh`) in a session of its own with the variables SkyPilot
sets (`SKYPILOT_NODE_IPS` = N × 127.0.0.1, `SKYPILOT_NODE_RANK`, ...), the checkpoint URI, its
own TMPDIR, its metadata URL and its process tag. Rank prefixes come from torchrun itself
(`--tee`, set through `PET_TEE` and `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`, so the rendered
task stays untouched); the log writer adds the node: `[node N rank R]`, `[node N]` for
torchrun's own lines, `[mncloud …]` for the supervisor's events.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from mncloud import constants, layout
from mncloud.backends.local.processes import LOCALHOST, node_tag
from mncloud.backends.local.state import (
    LOG_MARKS,
    RUN_LOG,
    LocalLaunch,
    node_ckpt_dir,
    node_dir,
    node_log,
    run_id_of,
)
from mncloud.spec.scriptargs import path_in

NOTICE_POLL_S = 0.5
"""How often a local node polls its (simulated) metadata for a preemption notice."""
TELEMETRY_INTERVAL_S = 0.5
"""Seconds between a local rank's telemetry segments (a cloud's default is 30 s): a rank
killed by `chaos preempt` loses at most this much of its steps, which the run's figures
count (steps lost, steps per attempt). `--env MNCLOUD_TELEMETRY_INTERVAL_S=…` overrides it."""
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:(.*)$", re.DOTALL)


def node_env(
    launch: LocalLaunch, folder: Path, node: int, *, metadata_url: str, setup: bool
) -> dict[str, str]:
    """The environment of `node`'s setup or run script (this process's plus SkyPilot's)."""
    own = node_dir(folder, node)
    for sub in ("tmp", "staging", "torchrun"):
        (own / sub).mkdir(parents=True, exist_ok=True)
    threads = str(launch.cpu_threads)
    env = dict(os.environ)
    env.update(launch.envs)
    ips = "\n".join([LOCALHOST] * launch.num_nodes)
    env.update({
        constants.SKYPILOT_NODE_IPS: ips,
        constants.SKYPILOT_NODE_RANK: str(node),
        constants.SKYPILOT_NUM_NODES: str(launch.num_nodes),
        constants.SKYPILOT_NUM_GPUS_PER_NODE: str(launch.procs_per_node),
        constants.SKYPILOT_TASK_ID: launch.task_id,
        constants.CKPT_URI_ENV: launch.ckpt_uri,
        constants.RUN_ID_ENV: run_id_of(launch),
        constants.TELEMETRY_INTERVAL_ENV: launch.envs.get(
            constants.TELEMETRY_INTERVAL_ENV, str(TELEMETRY_INTERVAL_S)
        ),
        constants.CKPT_STAGING_ENV: str(own / "staging"),
        constants.CPU_THREADS_ENV: threads,
        constants.CLOUD_ENV: "local",
        constants.METADATA_URL_ENV: metadata_url,
        constants.METADATA_PROTOCOL_ENV: "all",
        constants.METADATA_POLL_ENV: str(NOTICE_POLL_S),
        constants.LOCAL_NODE_TAG_ENV: node_tag(launch.token, node),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TMPDIR": str(own / "tmp"),
        constants.REFUSED_MARKER_ENV: str(refusal_marker(folder, node)),
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        # torchrun tees each worker's output with a rank prefix (the task stays untouched).
        "PET_TEE": "3",
        "PET_LOG_DIR": str(own / "torchrun"),
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
    })  # fmt: skip
    # First on the workers' path: what a framework needs on CPUs and not on GPUs (the Trainer's
    # `cpu:0` map_location) and mncloud's step callbacks (`mncloud.train.sitehook`).
    with_site_hook(env, folder)
    if constants.CKPT_DIR_ENV in launch.envs:  # --ckpt-dir: the node's own folder (ckptdir.py)
        own_ckpt_dir = str(node_ckpt_dir(folder, node))
        found = path_in(launch.envs[constants.CKPT_DIR_ENV])  # in --env values too, as on a VM
        env.update({k: found.sub(lambda _m: own_ckpt_dir, v) for k, v in launch.envs.items()})
        env[constants.CKPT_DIR_ENV] = own_ckpt_dir
    # Local nodes can be preempted with a notice at any time: watch (unless --env says no).
    env.setdefault(constants.PREEMPTION_WATCH_ENV, "1")
    if setup:
        env["SKYPILOT_SETUP_NODE_IPS"] = ips
        env["SKYPILOT_SETUP_NODE_RANK"] = str(node)
    return env


def with_site_hook(env: dict[str, str], folder: Path) -> None:
    """Put the run's site hook (`site_hook`) first on `env`'s PYTHONPATH: a node's run.sh and
    a warm host alike (a worker forked from a host starts no interpreter of its own)."""
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site_hook(folder)), *filter(None, [env.get("PYTHONPATH")])]
    )


def site_hook(folder: Path) -> Path:
    """The run's copy of mncloud's site hook (`layout.site_hook_source`), local nodes only: a
    cloud node's Python is the user's own."""
    hook = layout.site_hook_dir(folder)
    if not (hook / layout.SITE_HOOK_FILE).is_file():
        hook.mkdir(parents=True, exist_ok=True)
        tmp = hook / f".{layout.SITE_HOOK_FILE}.{os.getpid()}"
        shutil.copyfile(layout.site_hook_source(), tmp)
        os.replace(tmp, hook / layout.SITE_HOOK_FILE)
    return hook


def refusal_marker(folder: Path, node: int) -> Path:
    """Where `node`'s script leaves its one-line refusal (run.sh.j2 exits REFUSED_EXIT_CODE)."""
    return node_dir(folder, node) / "refused"


def refusal(folder: Path, codes: dict[int, int]) -> str | None:
    """The refusal of the first node that exited REFUSED_EXIT_CODE, naming it (None: none did)."""
    for node in sorted(n for n, c in codes.items() if c == constants.REFUSED_EXIT_CODE):
        try:
            line = refusal_marker(folder, node).read_text(encoding="utf-8").strip()
        except OSError:
            line = "it refused its input (see its log)"
        return f"node {node}: {line.splitlines()[0] if line else 'refused'}"
    return None


class RunLogs:
    """run.log (every node) and node-N.log, line-buffered, written from several threads."""

    def __init__(self, folder: Path, num_nodes: int) -> None:
        self._lock = threading.Lock()
        self._run_log = open(folder / RUN_LOG, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._node_logs = {
            n: open(folder / node_log(n), "a", buffering=1)  # noqa: SIM115
            for n in range(num_nodes)
        }
        self._marks = open(folder / LOG_MARKS, "a", buffering=1)  # noqa: SIM115
        self._offset = (folder / RUN_LOG).stat().st_size
        self._marked_at = 0.0
        self._pumps: list[threading.Thread] = []

    def write(self, line: str, node: int | None = None) -> None:
        with self._lock:
            now = time.time()
            if now - self._marked_at >= 1.0:  # run.log's size now, for `logs --since`
                self._marks.write(json.dumps({"t": now, "offset": self._offset}) + "\n")
                self._marked_at = now
            data = line + "\n"
            self._offset += len(data.encode("utf-8", errors="replace"))
            self._run_log.write(data)
            if node is not None:
                self._node_logs[node].write(line + "\n")

    def follow(self, node: int, stream: IO[bytes], label: str) -> None:
        """Copy a node's output into the logs, in a thread, each line with node and rank."""
        pump = threading.Thread(target=self._pump, args=(node, stream, label), daemon=True)
        pump.start()
        self._pumps.append(pump)

    def _pump(self, node: int, stream: IO[bytes], label: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            match = _RANK_PREFIX.match(line)
            if match:
                self.write(f"[node {node} rank {match[1]}] {match[2]}", node)
            else:
                self.write(f"[node {node}{label}] {line}", node)
        stream.close()

    def drain(self, timeout: float = 5.0) -> None:
        """Wait for the output of stopped nodes to be written."""
        for pump in self._pumps:
            pump.join(timeout=timeout)
        self._pumps.clear()

    def close(self) -> None:
        for f in (self._run_log, self._marks, *self._node_logs.values()):
            f.close()


def start_node(
    launch: LocalLaunch, folder: Path, node: int, script: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start `bash <script>` for `node` in a session of its own, its output piped."""
    return subprocess.Popen(
        ["/bin/bash", str(folder / script)],
        cwd=launch.workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
