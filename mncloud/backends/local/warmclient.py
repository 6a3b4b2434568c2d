"""The `PYTHON_EXEC` of a node on a warm host: hands a worker's Python to the host.

torchrun runs `$PYTHON_EXEC -u train.py ARGS` for each worker. This file, copied into the
node's folder as `python` under a `#!<python> -IS` line (stdlib only, no site: it starts in
milliseconds), sends its argv, environment, cwd and stdin/stdout/stderr to the node's host
(`warmhost.py`) over `host.sock` beside it, forwards SIGTERM/SIGINT/SIGHUP to the worker the
host forked, and exits as the worker did (its code, or the same signal). If it is killed, the
host sees the socket close and SIGKILLs the worker. A host still importing (`host.starting`
names it) is waited for. When the host is gone, or the command line is one the host does not
run (other flags), it becomes the real Python (`execv`). On a local node's PATH (`vm.py`) it
is also `python` and `torchrun` (`-m torch.distributed.run`).
"""

import contextlib
import json
import os
import signal
import socket
import sys
import time

SOCKET = "host.sock"
STARTING = "host.starting"
START_WAIT_S = 120.0


def _supported(argv: list[str]) -> bool:
    """`[-u] SCRIPT ARGS`, `[-u] -m MODULE ARGS` (what torchrun runs) or `-c CODE ARGS`."""
    rest = argv[1:] if argv[:1] == ["-u"] else argv
    if rest[:1] in (["-m"], ["-c"]):
        return len(rest) > 1
    return bool(rest) and not rest[0].startswith("-")


def _cold(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _starting() -> bool:
    """True while a host still imports (its STARTING file names a live host process)."""
    try:
        with open(STARTING) as f:
            pid = int(f.read().strip() or 0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"mncloud.backends.local" in f.read()
    except (OSError, ValueError):
        return False


def _connect(here: str, cwd: str) -> socket.socket | None:
    """The host's socket; waits (up to START_WAIT_S) for a host that is still starting."""
    deadline = time.monotonic() + START_WAIT_S
    try:  # a relative path: a socket's path may be at most 107 bytes
        os.chdir(here)
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect(SOCKET)
                return sock
            except OSError:
                sock.close()
            if not _starting() or time.monotonic() > deadline:
                return None
            time.sleep(0.02)
    finally:
        os.chdir(cwd)


def main() -> None:
    argv = sys.argv[1:]
    cwd = os.getcwd()
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    sock = _connect(here, cwd) if _supported(argv) else None
    if sock is None:
        _cold(argv)
        return
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": cwd}).encode()
    try:
        socket.send_fds(sock, [request], [0, 1, 2])
        reply = sock.recv(256).decode().split()
    except OSError:  # the host closed as we connected (it was ending): nothing was forked
        reply = []
    if len(reply) != 2 or reply[0] != "pid":  # the host ended before it forked: run cold
        sock.close()
        _cold(argv)
        return
    pid = int(reply[1])

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    status = sock.recv(256).decode().split()
    if len(status) != 2:
        print("mncloud: the warm host of this node ended during the run", file=sys.stderr)
        os._exit(1)
    if status[0] == "signal":
        sig = int(status[1])
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(int(status[1]))


if __name__ == "__main__":
    main()
