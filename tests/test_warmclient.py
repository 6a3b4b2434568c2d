"""A node's `PYTHON_EXEC` on a warm host (`backends/local/warmclient.py`) and the host's
forked child (`warmrun.py`), fast. With no host to hand a worker to (no socket, a stale one)
or a command line the host does not run, the client becomes the real Python and exits as it
did; the child computes a script's exit code as the interpreter does. One test starts a warm
host itself (one torch import, the only fast test that makes one: every module of `mncloud/`
has a fast test); its real runs are tests/test_local_warm.py's, slow."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mncloud.backends.local import warmclient


def _client(folder: Path) -> Path:
    """The client as `warm.start_hosts` installs it: `python` in the node's folder."""
    exe = folder / "python"
    exe.write_text(f"#!{sys.executable} -IS\n{Path(warmclient.__file__).read_text()}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.parametrize(
    ("argv", "supported"),
    [(["-u", "train.py", "--steps", "3"], True), (["-m", "pkg.train"], True),
     (["train.py"], True), (["-c", "print(1)"], True), (["-c"], False), (["-m"], False),
     ([], False), (["-u", "-X", "dev", "train.py"], False)],
)  # fmt: skip
def test_the_host_runs_only_what_torchrun_starts(argv: list[str], supported: bool) -> None:
    assert warmclient._supported(argv) is supported


def test_without_a_host_the_worker_runs_cold_and_exits_as_it_did(tmp_path: Path) -> None:
    exe = _client(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('cold', sys.argv[1:], flush=True)\nsys.exit(3)\n")
    done = subprocess.run([exe, "-u", str(script), "a"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "cold ['a']\n"

    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # bound, never listening
    stale.bind(str(tmp_path / warmclient.SOCKET))
    try:
        again = subprocess.run([exe, str(script), "b"], capture_output=True, text=True,
                               timeout=60, cwd=tmp_path)  # fmt: skip
    finally:
        stale.close()
    assert (again.returncode, again.stdout) == (3, "cold ['b']\n"), again.stderr

    inline = subprocess.run([exe, "-c", "print('inline')"], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)  # fmt: skip
    assert (inline.returncode, inline.stdout) == (0, "inline\n"), inline.stderr


DRIVER = (
    "import sys\nfrom mncloud.backends.local import warmrun\n"
    "code = warmrun._run(sys.argv[1:])\nprint('code', code, flush=True)\n"
)


@pytest.mark.parametrize(
    ("body", "code", "err"),
    [("import sys\nsys.exit(258)\n", 2, ""),
     ("import sys\nsys.exit('bad input')\n", 1, "bad input"),
     ("raise ValueError('boom')\n", 1, "ValueError: boom"), ("print('fine')\n", 0, "")],
)  # fmt: skip
def test_a_worker_forked_by_the_host_exits_as_a_fresh_python_would(
    tmp_path: Path, body: str, code: int, err: str
) -> None:
    """`warmrun` (the host's forked child) runs the script as `__main__` and computes its exit
    code as the interpreter does; a traceback starts at the script's frames, not the host's."""
    (tmp_path / "job.py").write_text(body)
    for argv in (["job.py"], ["-m", "job"]):
        done = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)  # fmt: skip
        assert done.stdout.splitlines()[-1] == f"code {code}", done.stderr
        assert err in done.stderr and "warmrun.py" not in done.stderr, done.stderr


def test_a_warm_host_forks_the_worker_and_ends_when_idle(tmp_path: Path) -> None:
    """The host itself (`warmhost.serve`, one torch import: a few seconds): the client hands
    it a `-c` worker, which the host forks and whose output and exit code come back as a
    fresh Python's would; the host ends after its idle time with no worker."""
    node = tmp_path / "node-0"
    node.mkdir()
    exe = _client(node)
    host = subprocess.Popen([sys.executable, "-m", "mncloud.backends.local", "host", str(node),
                             "3"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (node / warmclient.SOCKET).exists():  # listening (before: the client goes cold)
            assert host.poll() is None and time.monotonic() < deadline, "the host never listened"
            time.sleep(0.05)
        code = "import os, sys, torch; print('worker', os.getppid()); sys.exit(3)"
        done = subprocess.run([str(exe), "-c", code], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 3, done.stderr
        assert done.stdout.split() == ["worker", str(host.pid)], done.stdout  # forked by it
        assert host.wait(timeout=60) == 0, host.stderr.read() if host.stderr else ""
        assert not (node / warmclient.SOCKET).exists()  # it took its socket with it
    finally:
        if host.poll() is None:
            host.kill()
