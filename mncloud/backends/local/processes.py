"""Process tools of the local backend, on psutil: a node's processes, liveness, ports.

Every process of a local node carries `MNCLOUD_LOCAL_NODE=<run token>/<node>` in its
environment, inherited from the node's launcher. That tag, not the process tree, is how the
supervisor, `mncloud chaos` and `mncloud down` find a node's processes: torchrun puts its
workers in sessions of their own, and a worker whose torchrun died is reparented. The
supervisor carries `<run token>/supervisor` (set before it starts, so `down` finds even one
that has not written its pid yet) and node recovery's lighthouse `<run token>/lighthouse`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from collections.abc import Collection, Iterable

import psutil

from mncloud import constants

LOCALHOST = "127.0.0.1"
SUPERVISOR_MODULE = "mncloud.backends.local"
"""What the supervisor's command line contains (`python -m mncloud.backends.local supervise`)."""
SUPERVISOR_NODE = "supervisor"
"""The supervisor's process tag suffix (`<token>/supervisor`)."""
_DEAD = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
_PR_SET_CHILD_SUBREAPER = 36


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


def pid_alive(pid: int | None) -> bool:
    """True when `pid` runs (a zombie is dead: it only waits for its parent to reap it)."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() not in _DEAD
    except psutil.Error:
        return False


def node_tag(token: str, node: int | str) -> str:
    """The env tag of one node's processes."""
    return f"{token}/{node}"


def _tag_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get(constants.LOCAL_NODE_TAG_ENV)
    except psutil.Error:  # gone, a zombie, or not ours to read
        return None


def tagged_processes(token: str, node: int | str | None = None) -> list[psutil.Process]:
    """Live processes of one node of a run (or of all its nodes), found by their env tag."""
    want = node_tag(token, node) if node is not None else None
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        tag = _tag_of(proc)
        if tag is not None and (tag == want if want is not None else tag.startswith(f"{token}/")):
            found.append(proc)
    return found


def tagged_pids(token: str, node: int | str | None = None) -> list[int]:
    return sorted(p.pid for p in tagged_processes(token, node))


def kill_tagged(
    token: str,
    node: int | str | None = None,
    sig: int = signal.SIGKILL,
    exclude: Collection[int] = (),
) -> list[int]:
    """Signal every process of a node (or of the run) until none is left; return their pids.

    Rescans after each round: a process forked between the scan and the kill is caught by
    the next one. Zombies carry no environment and are not counted. `exclude`: pids spared
    (the node hosts a gang relaunch keeps, `vm.py`).
    """
    hit: set[int] = set()
    for _ in range(100):
        procs = [
            p for p in tagged_processes(token, node) if p.pid not in exclude and pid_alive(p.pid)
        ]
        if not procs:
            break
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        hit.update(p.pid for p in procs)
        if sig != signal.SIGKILL:
            break
        time.sleep(0.01)
    return sorted(hit)


def wait_gone(pids: Iterable[int], timeout: float, interval: float = 0.05) -> list[int]:
    """Wait until none of `pids` runs (zombies count as gone); return those still running."""
    left = [p for p in pids if pid_alive(p)]
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(interval)
        left = [p for p in left if pid_alive(p)]
    return left


def become_subreaper() -> None:
    """Orphans of the nodes (workers whose torchrun died) become our children, so we reap them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(keep: set[int]) -> None:
    """Reap zombie children we did not start ourselves (`keep`: pids Popen waits for)."""
    for child in psutil.Process().children():
        if child.pid in keep:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)


def is_supervisor(pid: int | None) -> bool:
    """True when `pid` runs and is a local-backend supervisor (not a reused pid)."""
    if not pid_alive(pid):
        return False
    try:
        return SUPERVISOR_MODULE in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on TCP `port` of this machine, or None."""
    for conn in psutil.net_connections(kind="tcp"):
        listening = conn.status == psutil.CONN_LISTEN and conn.laddr
        if listening and conn.laddr.port == port and conn.pid is not None:
            return conn.pid
    return None


def describe_exit(code: int) -> str:
    """A node's exit code in words: a signal, a preemption notice, or a plain code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    if code == constants.PREEMPTED_EXIT_CODE:
        return f"stopped for a preemption notice (exit {code})"
    if code == constants.REFUSED_EXIT_CODE:
        return f"refused its input (exit {code})"
    if code == constants.STORAGE_OUTAGE_EXIT_CODE:
        return f"found its bucket unreachable (exit {code}: a storage outage)"
    return f"exited with code {code}"
