"""Warm node hosts of a local `up --cluster` run: its nodes kept up between runs.

The local analog of `sky exec` on a cluster kept up. When a `--cluster` run's supervisor
reports its first step (or ends), it starts one host per node (`warmhost.py`, in a session of
its own, tagged `<hosts token>/host-N`, recorded in `hosts.json`): their imports never compete
with the first run's own start on a few cores. A node whose host listens gets
`PYTHON_EXEC=<node folder>/python` (`warmclient.py`): torchrun stays real and the rendered
task unchanged, but each worker is forked from the host, torch already imported. (Every
local run also has a host per node while it runs, `vm.py`; these outlive the run, for exec.)
Example, `--idle-minutes 10`:

    t=0      up --cluster: setup, preflight, run 1 with cold workers
    t=20     its first step: hosts start on nodes 0, 1 (or when run 1 ends, if sooner)
    t=60     run 1 fails on a typo; the hosts stay, idle
    t=120    exec: both nodes' workers forked from the hosts, first step seconds sooner
    t=780    10 minutes without a job: each host exits (the local autostop); a later exec
             starts cold and says so

`mncloud down` (and a fresh `up` of the name) stops them (`stop_hosts`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import BaseModel

from mncloud import constants
from mncloud.backends.local import processes
from mncloud.backends.local.nodes import with_site_hook
from mncloud.backends.local.state import SUPERVISOR_LOG, LocalLaunch, last_step, node_dir
from mncloud.storage import write_atomic

HOSTS_FILE = "hosts.json"
CLIENT = "python"
"""The client's name in a node's folder (torchrun's PYTHON_EXEC there)."""
SOCKET = "host.sock"
READY_WAIT_S = 30.0
"""How long an `exec` waits for hosts still importing (one started a moment ago): a worker
forked from one a second later still starts sooner than a cold one."""


class HostsRecord(BaseModel):
    """hosts.json: the run's warm hosts."""

    token: str
    """Their process tags are `<token>/host-N`, apart from any launch's."""
    idle_s: float
    pids: list[int]
    """By node."""
    started_at: float


def load_hosts(folder: Path) -> HostsRecord | None:
    path = folder / HOSTS_FILE
    try:
        return HostsRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def host_tag(node: int) -> str:
    return f"host-{node}"


def start_hosts(folder: Path, launch: LocalLaunch, idle_s: float) -> HostsRecord:
    """Start one host per node (detached: they outlive the supervisor); record them."""
    token = uuid.uuid4().hex[:12]
    client = Path(__file__).with_name("warmclient.py").read_text()
    pids = []
    threads = str(launch.cpu_threads)
    for node in range(launch.num_nodes):
        own = node_dir(folder, node)
        own.mkdir(parents=True, exist_ok=True)
        exe = own / CLIENT
        exe.write_text(f"#!{sys.executable} -IS\n{client}")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        env = dict(os.environ)  # libgomp and MKL read their thread counts when torch loads
        env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        # The site hook in the host itself: it imports torch ahead of the workers (the `cpu:0`
        # location registered then), and the workers forked from it keep its import hook.
        with_site_hook(env, folder)
        env[constants.LOCAL_NODE_TAG_ENV] = processes.node_tag(token, host_tag(node))
        with open(folder / SUPERVISOR_LOG, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", processes.SUPERVISOR_MODULE, "host", str(own), str(idle_s)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        pids.append(proc.pid)
    record = HostsRecord(token=token, idle_s=idle_s, pids=pids, started_at=time.time())
    write_atomic(folder / HOSTS_FILE, record.model_dump_json(indent=2))
    return record


class Hosts:
    """A supervisor's warm hosts: none (not `--cluster`), pending (a fresh `up`: they start
    once the first step is reported, or when the run ends, so their imports never compete with
    the first run's start on a few cores), or the recorded ones (`exec`)."""

    def __init__(self, folder: Path, launch: LocalLaunch) -> None:
        self.folder, self.launch = folder, launch
        self.record: HostsRecord | None = None
        self._pending = False

    def begin(self, say: Callable[[str], None]) -> None:
        """At the supervisor's start: note pending hosts, or find (and wait for) live ones."""
        launch, folder = self.launch, self.folder
        self._pending = launch.idle_s is not None and load_hosts(folder) is None
        if self._pending:
            say("[mncloud] local cluster: warm hosts start on each node once the first step is "
                "reported (this run's workers fork from its own node hosts)")  # fmt: skip
        elif launch.idle_s is not None:
            self.record = live_hosts(folder)
            if self.record is None:
                say("[mncloud] the local cluster's warm hosts are gone (its idle time passed, "
                    "or they were stopped): each node's own host imports torch afresh")  # fmt: skip
            else:  # started when the run's first step came: seconds from ready at most
                _wait_ready(folder, self.record, READY_WAIT_S)

    def start(self, *, first_step: bool = True) -> None:
        """Start the pending hosts (with `first_step`: only once a step was reported)."""
        if self._pending and (not first_step or last_step(self.folder) is not None):
            self._pending = False
            assert self.launch.idle_s is not None
            self.record = start_hosts(self.folder, self.launch, self.launch.idle_s)

    def env(self, node: int) -> dict[str, str]:
        return worker_env(self.folder, node, self.record)

    def node_workers(self, node: int) -> list[int]:
        """The workers `node`'s host forked (tagged as the host, not as the launch)."""
        if self.record is None or node >= len(self.record.pids):
            return []
        one = self.record.model_copy(update={"pids": [self.record.pids[node]]})
        return workers(one)

    def wait_workers_gone(self) -> list[int]:
        return wait_workers_gone(self.record)


def _wait_ready(folder: Path, record: HostsRecord, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    nodes = range(len(record.pids))
    while time.monotonic() < deadline and not all(worker_env(folder, n, record) for n in nodes):
        if not all(_is_host(pid, record.token) for pid in record.pids):
            return
        time.sleep(0.05)


def _is_host(pid: int, token: str) -> bool:
    try:
        tag = psutil.Process(pid).environ().get(constants.LOCAL_NODE_TAG_ENV, "")
    except psutil.Error:
        return False
    return processes.pid_alive(pid) and tag.startswith(f"{token}/host-")


def live_hosts(folder: Path) -> HostsRecord | None:
    """The run's hosts when every one still runs, else None (gone: idle, `down`, a crash)."""
    record = load_hosts(folder)
    if record is None or not all(_is_host(pid, record.token) for pid in record.pids):
        return None
    return record


def worker_env(folder: Path, node: int, record: HostsRecord | None) -> dict[str, str]:
    """`PYTHON_EXEC` for `node` when its host listens; {} (cold workers) otherwise."""
    if record is None or node >= len(record.pids) or not _is_host(record.pids[node], record.token):
        return {}
    own = node_dir(folder, node)
    if not (own / SOCKET).exists():
        return {}
    return {"PYTHON_EXEC": str(own / CLIENT)}


def workers(record: HostsRecord | None) -> list[int]:
    """The live workers the hosts forked (their children)."""
    found = []
    for pid in record.pids if record is not None else []:
        try:
            children = psutil.Process(pid).children()
        except psutil.Error:
            continue
        found += [c.pid for c in children if processes.pid_alive(c.pid)]
    return found


def wait_workers_gone(record: HostsRecord | None, timeout: float = 10.0) -> list[int]:
    """After a launch's processes were killed: wait until the hosts reaped its workers (a
    host SIGKILLs a worker as soon as its client's socket closes); SIGKILL any left."""
    left = processes.wait_gone(workers(record), timeout)
    for pid in left:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    return processes.wait_gone(left, 5.0)


def stop_hosts(folder: Path) -> int:
    """SIGKILL the run's hosts and their workers (found by tag); return how many ran."""
    record = load_hosts(folder)
    if record is None:
        return 0
    killed = processes.kill_tagged(record.token)
    processes.wait_gone(killed, 5.0)
    (folder / HOSTS_FILE).unlink(missing_ok=True)
    return sum(1 for _ in killed)


def idle_note(folder: Path) -> str | None:
    """What `status` says of a cluster run's hosts once its job ended (None: not a cluster)."""
    record = load_hosts(folder)
    if record is None:
        return None
    if live_hosts(folder) is None:
        return "its warm hosts are gone (a local `exec` starts cold)"
    minutes = record.idle_s / 60
    return f"local cluster tears down after {minutes:g} idle minutes (`mncloud down` ends it now)"
