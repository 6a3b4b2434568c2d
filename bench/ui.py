"""`mncloud ui`: time to a complete page against `mncloud runs ls --json` over the same records.

Builds a throwaway MNCLOUD_HOME with N finished local runs (their run folders and records,
no processes, no checkpoints) and one run whose record holds E events, then times, in this
process (median of several requests, the whole body read): the runs page, that run's page,
and `mncloud runs ls --json` (through Typer's CliRunner, so no interpreter start-up on
either side). Prints the times and the ratios.

    python bench/ui.py [--runs 1000] [--events 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _populate(runs: int, events: int) -> str:
    """N finished runs and one with `events` events; the name of that one."""
    from mncloud import layout
    from mncloud.backends.base import RunState
    from mncloud.backends.local.state import LocalLaunch, LocalState, save_launch, save_state
    from mncloud.backends.registry import BACKEND_FILE
    from mncloud.records.model import Event, RunRecord
    from mncloud.records.store import save_record

    now = time.time() - 3600
    for i in range(runs):
        name = f"bench-{i:04d}"
        run_id = f"{name}-20260101T000000-{i:06x}"
        n = events if i == runs - 1 else 4
        kinds = ["launch", "preemption"] * (n // 2)
        evs = [Event(kind=k, time=now + j, spot=True, hourly_price=3.0)  # type: ignore[arg-type]
               for j, k in enumerate(kinds)]  # fmt: skip
        evs.append(Event(kind="finish", time=now + n))
        record = RunRecord(run_id=run_id, name=name, user="u", host="h", created_at=now,
                           backend="local", nodes=2, spec={"script": "train.py"}, task_yaml="",
                           events=evs)  # fmt: skip
        save_record(record)
        folder = layout.run_dir(name)
        folder.mkdir(parents=True)
        (folder / BACKEND_FILE).write_text(json.dumps({"backend": "local"}))
        shape = {"name": name, "token": f"{i:012x}", "task_id": f"t-{i}", "num_nodes": 2,
                 "procs_per_node": 1, "master_port": 29500, "ckpt_uri": ""}  # fmt: skip
        save_launch(folder, LocalLaunch(**shape, run_id=run_id, workdir=".", run="true"))
        save_state(folder, LocalState(**shape, state=RunState.SUCCEEDED, started_at=now,
                                      ended_at=now + n, detail="succeeded"))  # fmt: skip
    return f"bench-{runs - 1:04d}"


def _median(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ["MNCLOUD_HOME"] = tempfile.mkdtemp(prefix="mncloud-bench-ui-")
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from mncloud.cli import app as cli_app
    from mncloud.ui.app import create_app

    big = _populate(args.runs, args.events)
    client, runner = TestClient(create_app()), CliRunner()

    def get(path: str) -> None:
        response = client.get(path)
        assert response.status_code == 200 and response.text.rstrip().endswith("</html>"), path

    def runs_ls() -> None:
        assert runner.invoke(cli_app, ["runs", "ls", "--json"]).exit_code == 0

    runs_page = _median(lambda: get("/"), args.repeat)
    run_page = _median(lambda: get(f"/runs/{big}"), args.repeat)
    cli = _median(runs_ls, args.repeat)
    print(f"runs page, {args.runs} runs           {runs_page:7.3f} s")
    print(f"run page, {args.events} events        {run_page:7.3f} s")
    print(f"mncloud runs ls --json, {args.runs} runs {cli:7.3f} s")
    print(f"ratio runs page / runs ls --json = {runs_page / cli:.2f}x")
    print(f"ratio run page / runs ls --json  = {run_page / cli:.2f}x")


if __name__ == "__main__":
    main()
