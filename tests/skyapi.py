"""SkyPilot's real API server (0.14.1) started offline for the contract tests: on a free port
of 127.0.0.1, its HOME and runtime state in a folder of the test's, with no cloud enabled;
stopped with every worker it started. See docs/guides/skypilot-contract.md."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

START_S = 240.0
"""How long the server may take to answer its health check before the `real` side skips (it
takes ~9 s on an idle machine); not an assertion."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=2) as answer:
            return json.loads(answer.read()).get("status") == "healthy"
    except (OSError, ValueError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The server and every worker it started (its own process group), TERM then KILL."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig is signal.SIGTERM:  # its workers may outlive it: the group again, hard
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return


@contextlib.contextmanager
def serve(folder: Path, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The server (`python -m sky.server.server`, what `sky api start` runs) with `settings`
    (the server's environment: `ENABLE_SERVICE_ACCOUNTS`...); its URL. Skips the test with
    the log's last line where it does not start."""
    port, log_path = free_port(), folder / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYPILOT_API_SERVER")}
    # The local port moves the server's internal request-queue port (50011) in lockstep
    # (`sky/server/requests/queues/mp_queue.py`): two servers at once (the suite's two
    # workers) do not collide there.
    env.update(HOME=str(folder), SKY_RUNTIME_DIR=str(folder), IS_SKYPILOT_SERVER="true",
               SKYPILOT_DISABLE_USAGE_COLLECTION="1", SKYPILOT_API_SERVER_LOCAL_PORT=str(port),
               **(settings or {}))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sky.server.server", "--host=127.0.0.1", f"--port={port}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        give_up = time.monotonic() + START_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > give_up:
                tail = log_path.read_text(errors="replace")[-400:].strip().splitlines()
                pytest.skip(f"SkyPilot's API server did not start: {tail[-1] if tail else ''}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(proc)


def forget_server() -> None:
    """The client's cached view of the server (its URL, whether local, its health) dropped."""
    from sky.server import common

    common.get_server_url.cache_clear()
    common.is_api_server_local.cache_clear()
    common.get_api_server_status_response.cache_clear()
