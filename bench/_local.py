"""What the local-backend benchmarks share: the example, the CLI, waiting on run state, the
run's telemetry as lines."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"


def mncloud(*args: str) -> str:
    """Run the `mncloud` CLI of this interpreter's environment; return its stdout."""
    exe = Path(sys.executable).parent / "mncloud"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mncloud"]
    return subprocess.run([*cmd, *args], check=True, capture_output=True, text=True).stdout


def wait(check: Callable[[], T], timeout: float, what: str) -> T:
    """Poll `check` until it returns something truthy; exit the benchmark on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise SystemExit(f"{Path(sys.argv[0]).name}: timed out waiting for {what}")


def fresh_home() -> Path:
    """Point mncloud at a new, empty MNCLOUD_HOME (and the offline catalog when beside us)."""
    home = Path(tempfile.mkdtemp(prefix="mncloud-bench-"))
    os.environ["MNCLOUD_HOME"] = str(home)
    shared = REPO.parent / "shared" / "catalogs"
    if shared.is_dir():
        os.environ.setdefault("MNCLOUD_CATALOG_DIR", str(shared))
    return home


def progress_lines(folder: Path) -> list[dict[str, Any]]:
    """A local run's telemetry as lines in time order: rank 0's steps `{"t", "step", "node"}`
    (of each node under node recovery) and every event `{"t", "event", "node", …}`."""
    from mncloud.backends.local.figures import read_run_series

    series = read_run_series(folder)
    lines = [{"t": r.t, "step": r.step, "node": r.node or 0} for r in series.steps if r.rank == 0]
    lines += [{**e.data, "t": e.t, "event": e.event, "node": e.node or 0} for e in series.events]
    return sorted(lines, key=lambda r: r["t"])
