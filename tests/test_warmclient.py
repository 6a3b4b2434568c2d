"""A node's `PYTHON_EXEC` on a warm host (`backends/local/warmclient.py`), fast: with no host
to hand a worker to (no socket, a stale one) or a command line the host does not run, it
becomes the real Python and exits as it did. The warm host itself (it imports torch) is
tests/test_local_warm.py's, slow."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
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
     (["train.py"], True), (["-c", "print(1)"], False), (["-m"], False), ([], False),
     (["-u", "-X", "dev", "train.py"], False)],
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
