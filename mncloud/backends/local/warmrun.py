"""Inside a warm host's forked child: become the worker a client asked for and run it.

What `python -u SCRIPT ARGS` (or `-m MODULE`, `-c CODE`) does from here: the client's
environment (also for C code: `os.environ` calls putenv), cwd, argv and `sys.path[0]`,
unbuffered stdio over the client's fds, then the script as `__main__`. The RNGs a fresh
process would have: `random` and torch's generator reseeded from the OS (the host seeded
them once, at import), torch's threads from OMP_NUM_THREADS. At the end, what interpreter
shutdown does: non-daemon threads joined, atexit handlers run, stdio flushed.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import signal
import sys
import tempfile
import threading
import traceback
from types import TracebackType
from typing import Any


def become(request: dict[str, Any]) -> int:
    """Run the request's script or module in this process; return the exit code."""
    argv = [str(a) for a in request["argv"]]
    if argv[:1] == ["-u"]:
        argv = argv[1:]
    env = {str(k): str(v) for k, v in request["env"].items()}
    os.environ.clear()
    os.environ.update(env)
    os.chdir(str(request["cwd"]))
    _stdio()
    tempfile.tempdir = None  # TMPDIR is the node's now
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra
    _fresh_rngs(env)
    code = _run(argv)
    code = _shutdown(code)
    return code


def _stdio() -> None:
    """sys.std* over fds 0–2 as `python -u` makes them (binary unbuffered, write-through)."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        errors = "backslashreplace" if fd == 2 else "strict"
        stream = io.TextIOWrapper(raw, write_through=True, errors=errors)  # type: ignore[arg-type]
        setattr(sys, name, stream)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _fresh_rngs(env: dict[str, str]) -> None:
    import torch

    random.seed()
    torch.seed()  # a fresh process seeds torch's generator from the OS too
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _run(argv: list[str]) -> int:
    """The script as `__main__`; its exit code as Python computes it."""
    import runpy

    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            code = compile(argv[1], "<string>", "exec")
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        return _exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException as err:
        tb = _user_frames(err.__traceback__)
        sys.excepthook(type(err), err.with_traceback(tb), tb)
        return 1
    return 0


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's frames on, as a fresh interpreter prints it."""
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
        or tb.tb_frame.f_code.co_filename.endswith("runpy.py")
    ):
        tb = tb.tb_next
    return tb


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _shutdown(code: int) -> int:
    """What the interpreter does at exit before the process ends."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
        atexit._run_exitfuncs()
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe at exit is not an error here
            stream.flush()
    return code
