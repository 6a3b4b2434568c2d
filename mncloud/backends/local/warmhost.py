"""A warm node host: one Python per local node (`vm.py`; `warm.py` for `--cluster`) that imported
torch once.

`python -m mncloud.backends.local host NODE_DIR IDLE_S` imports torch and `torch.distributed`,
listens on `NODE_DIR/host.sock`, and at its first quiet moment (the preflight it forked
running meanwhile) imports the rest a training script needs (`torch.distributed.checkpoint`,
`mncloud.train`). It
never runs a torch op (no thread pool exists when it forks). Each connection is one worker
(`warmclient.py`): argv, environment, cwd and three fds. The host forks a child that becomes
that worker (the environment, cwd, argv and fds set, `random` and torch's generator reseeded,
`torch.set_num_threads` from OMP_NUM_THREADS) and runs the
script as `python -u` would (`runpy`, `__main__`, its exit code; an exception printed as
Python prints it, exit 1). The host replies `pid N`, then `exit C` or `signal S`. Example:

    t=0    torchrun on node 0 runs `nodes/node-0/python -u train.py` twice (PYTHON_EXEC)
    t=0.02 two clients connect; the host forks two workers (torch already imported)
    t=9    chaos preempt SIGKILLs node 0's processes: both clients die, their sockets
           close, and the host SIGKILLs both workers at once (no orphan outlives its launch)

It exits after IDLE_S without a worker (the local autostop), when its socket file is gone or
replaced (the run folder was rewritten), or on SIGTERM; a worker also dies with its host
(PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

SOCKET = "host.sock"
STARTING = "host.starting"
_PR_SET_PDEATHSIG = 1
_TICK_S = 1.0


@dataclass
class _Job:
    conn: socket.socket
    pid: int
    pidfd: int


FIRST_MODULES = ("torch", "torch.distributed", "torch.nn", "torch.utils.data")
"""What the host imports before it listens: enough for the preflight and torchrun's agent."""
LATER_MODULES = ("torch.distributed.checkpoint", "mncloud.storage", "mncloud.train")
"""What every worker of a training script imports too (~1 s of CPU more): imported at the
first quiet moment once the host listens, so the preflight it forked runs meanwhile."""
WARM_MODULES = FIRST_MODULES + LATER_MODULES
"""What every worker of a training script imports first (2–3 s of CPU each)."""
_LATER_WAIT_S = 0.05


def warm_imports(names: tuple[str, ...] = WARM_MODULES) -> None:
    for name in names:
        importlib.import_module(name)


def serve(node_dir: Path, idle_s: float, parent: int | None = None) -> int:
    """Listen on `node_dir/host.sock` and run workers until idle; return an exit code.

    With `parent` (a local node's host, `vm.py`): it also exits once that process is gone,
    and says it is starting (`STARTING` holds its pid) so clients wait for it, not run cold."""
    os.chdir(node_dir)
    if parent is not None:
        if os.getppid() != parent:
            return 0
        Path(STARTING).write_text(str(os.getpid()))
    try:
        return _serve(idle_s, parent)
    finally:
        if parent is not None:
            with contextlib.suppress(OSError):
                os.unlink(STARTING)


def _serve(idle_s: float, parent: int | None) -> int:
    warm_imports(FIRST_MODULES)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{SOCKET}.tmp")
    listener.bind(f"{SOCKET}.tmp")
    listener.listen(64)
    os.rename(f"{SOCKET}.tmp", SOCKET)  # ready only once it listens
    with contextlib.suppress(OSError):
        os.unlink(STARTING)
    inode = os.stat(SOCKET).st_ino
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    jobs: dict[int, _Job] = {}  # by pid
    idle_since = time.monotonic()
    try:
        later = True
        while True:
            ready = sel.select(timeout=_LATER_WAIT_S if later else _TICK_S)
            for key, _ in ready:
                _handle(key.data, listener, sel, jobs)
            if later and not ready:  # nobody waits: the rest of the imports now
                warm_imports(LATER_MODULES)
                later = False
            if parent is not None and os.getppid() != parent:  # its node (the VM) is gone
                return 0
            if jobs or not _own_socket(inode):
                idle_since = time.monotonic()
                if not _own_socket(inode):
                    return 0
            elif time.monotonic() - idle_since >= idle_s and not sel.select(timeout=0):
                return 0  # idle, and nobody connected meanwhile (during the later imports)
    finally:
        for job in jobs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.pid, signal.SIGKILL)
        if _own_socket(inode):
            os.unlink(SOCKET)


def _own_socket(inode: int) -> bool:
    try:
        return os.stat(SOCKET).st_ino == inode
    except OSError:
        return False


def _handle(
    data: Any, listener: socket.socket, sel: selectors.BaseSelector, jobs: dict[int, _Job]
) -> None:
    """One ready thing: a new client, a client's socket (its EOF), or a worker's exit."""
    if data is None:
        conn, _ = listener.accept()
        sel.register(conn, selectors.EVENT_READ, ("new", conn))
        return
    kind, obj = data
    if kind == "new":
        sel.unregister(obj)
        job = _start(obj, listener, sel, jobs)
        if job is None:
            obj.close()
            return
        jobs[job.pid] = job
        sel.register(obj, selectors.EVENT_READ, ("client", job))
        sel.register(job.pidfd, selectors.EVENT_READ, ("exit", job))
    elif kind == "client":  # the client closed (or died): the worker goes with it
        sel.unregister(obj.conn)
        with contextlib.suppress(ProcessLookupError):
            os.kill(obj.pid, signal.SIGKILL)
    else:
        _reap(obj, sel, jobs)


def _reap(job: _Job, sel: selectors.BaseSelector, jobs: dict[int, _Job]) -> None:
    _, status = os.waitpid(job.pid, 0)
    sel.unregister(job.pidfd)
    os.close(job.pidfd)
    jobs.pop(job.pid, None)
    with contextlib.suppress(KeyError, ValueError):
        sel.unregister(job.conn)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    reply = f"signal {sig}" if sig else f"exit {os.waitstatus_to_exitcode(status)}"
    with contextlib.suppress(OSError):
        job.conn.send(reply.encode())
    job.conn.close()


def _start(
    conn: socket.socket, listener: socket.socket, sel: selectors.BaseSelector, jobs: dict[int, _Job]
) -> _Job | None:
    """Read a client's request and fork its worker; None when the request is unreadable."""
    try:
        raw, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(raw)
    except (OSError, ValueError):
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    host = os.getpid()
    try:
        pid = os.fork()
    except OSError:  # no memory or pids left: the client, told nothing, runs cold
        for fd in fds:
            os.close(fd)
        return None
    if pid == 0:
        inherited = [listener.fileno(), conn.fileno(), _selector_fd(sel)]
        inherited += [j.conn.fileno() for j in jobs.values()] + [j.pidfd for j in jobs.values()]
        _worker(request, fds, host, [fd for fd in inherited if fd is not None and fd > 2])
    for fd in fds:
        os.close(fd)
    job = _Job(conn=conn, pid=pid, pidfd=os.pidfd_open(pid))
    with contextlib.suppress(OSError):
        conn.send(f"pid {pid}".encode())
    return job


def _selector_fd(sel: selectors.BaseSelector) -> int | None:
    fileno = getattr(sel, "fileno", None)
    return int(fileno()) if fileno is not None else None


def _worker(request: dict[str, Any], fds: list[int], host: int, close: list[int]) -> NoReturn:
    """In the forked child: become the worker, run it, exit with its code."""
    code = 1
    try:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != host:  # the host died between fork and prctl
            os._exit(1)
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        from mncloud.backends.local import warmrun

        code = warmrun.become(request)
    finally:
        os._exit(code)
