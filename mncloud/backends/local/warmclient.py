"""The `PYTHON_EXEC` of a node on a warm host: hands a worker's Python to the host.

torchrun runs `$PYTHON_EXEC -u train.py ARGS` for each worker. This file, copied into the
node's folder as `python` under a `#!<python> -IS` line (stdlib only, no site: it starts in
milliseconds), sends its argv, environment, cwd and stdin/stdout/stderr to the node's host
(`warmhost.py`) over `host.sock` beside it, forwards SIGTERM/SIGINT/SIGHUP to the worker the
host forked, and exits as the worker did (its code, or the same signal). If it is killed, the
host sees the socket close and SIGKILLs the worker. When the host is gone, or the command line
is one the host does not run (`-c`, other flags), it becomes the real Python (`execv`).
"""

import contextlib
import json
import os
import signal
import socket
import sys

SOCKET = "host.sock"


def _supported(argv: list[str]) -> bool:
    """`[-u] SCRIPT ARGS` or `[-u] -m MODULE ARGS`: what torchrun runs."""
    rest = argv[1:] if argv[:1] == ["-u"] else argv
    if rest[:1] == ["-m"]:
        return len(rest) > 1
    return bool(rest) and not rest[0].startswith("-")


def _cold(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _connect(here: str, cwd: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:  # a relative path: a socket's path may be at most 107 bytes
        os.chdir(here)
        sock.connect(SOCKET)
    except OSError:
        sock.close()
        return None
    finally:
        os.chdir(cwd)
    return sock


def main() -> None:
    argv = sys.argv[1:]
    cwd = os.getcwd()
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    sock = _connect(here, cwd) if _supported(argv) else None
    if sock is None:
        _cold(argv)
        return
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": cwd}).encode()
    socket.send_fds(sock, [request], [0, 1, 2])
    reply = sock.recv(256).decode().split()
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
