"""Long runs' telemetry written cheaply with the real writer, for the tests and the bench of
reads that must not grow with a run's length (`tests/test_rollup.py`,
`tests/test_record_index.py`, `bench/_scale_status.py`).

`write_run` writes what `mncloud.train.report` would for each rank of each launch: one step a
`step_s`, a loss, a save's stall every `ckpt_every` steps, segments of `per_segment` records
(the writer's 30 s at one step a second), each rank its own process (launch tag and start).
`local_run` makes such a run a finished local run `status NAME` finds; `opened_under` counts
the files a block opens under a folder (what a read costs, counted, never timed).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mncloud.telemetry.series import SeriesWriter

T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Launch:
    """One launch of the gang: its steps, and when its processes start."""

    first: int
    last: int
    start: float


def launches_of(steps: int, relaunch: tuple[int, int] | None = None) -> list[Launch]:
    """One launch of `steps` steps, or (with `relaunch` = (killed after, resumed from)) a
    second one that starts 60 s after the first's last step."""
    if relaunch is None:
        return [Launch(1, steps, T0)]
    killed, resumed = relaunch
    return [Launch(1, killed, T0), Launch(resumed + 1, steps, T0 + 30 + killed + 60)]


def write_run(
    uri: str,
    ranks: int,
    launches: list[Launch],
    *,
    per_node: int = 8,
    per_segment: int = 30,
    ckpt_every: int = 100,
    step_s: float = 1.0,
    slow: dict[int, float] | None = None,
    close: bool = True,
) -> list[SeriesWriter]:
    """Every rank's segments for `launches` (module docstring); rank r of `slow` takes that
    many times `step_s` a step. Without `close` the writers stop without their last rollup
    (a live or preempted run: readers fold the tail)."""
    writers = []
    for k, launch in enumerate(launches):
        for rank in range(ranks):
            w = SeriesWriter(uri, rank, node=rank // per_node, background=False,
                             launch=f"{k + 1:x}{rank:05x}-{rank + 1:x}")  # fmt: skip
            w.t0 = launch.start + rank * 0.01
            pace = step_s * (slow or {}).get(rank, 1.0)
            for i, step in enumerate(range(launch.first, launch.last + 1)):
                record = {"k": "step", "t": launch.start + 30 + (i + 1) * pace + rank * 1e-3,
                          "step": step, "m": {"loss": 10.0 / step}}  # fmt: skip
                if step % ckpt_every == 0:
                    record["ckpt_s"] = 0.25
                w.add(record)
                if (i + 1) % per_segment == 0:
                    assert w.flush()
            w.flush()
            if close:
                w.write_rollup()
            writers.append(w)
    return writers


def local_run(
    name: str,
    bucket_dir: str,
    ranks: int,
    launches: list[Launch],
    *,
    close: bool = True,
    slow: dict[int, float] | None = None,
    per_segment: int = 30,
) -> str:
    """A finished local run as `status NAME` finds it (its run folder, its record with a
    `file://` bucket, no processes) whose ranks wrote `launches`; its series URI."""
    import json

    from mncloud import layout
    from mncloud.backends.base import RunState
    from mncloud.backends.local.state import LocalLaunch, LocalState, save_launch, save_state
    from mncloud.backends.registry import BACKEND_FILE
    from mncloud.records.model import Event, RunRecord
    from mncloud.records.store import save_record

    start, end = launches[0].start, launches[-1].start + 90 + launches[-1].last
    run_id = f"{name}-20231114T221320-{len(name):06x}"
    events = [Event(kind="launch", time=start, spot=True, hourly_price=36.0)]
    events += [Event(kind="restart", time=x.start, spot=True, hourly_price=36.0)
               for x in launches[1:]]  # fmt: skip
    record = RunRecord(
        run_id=run_id, name=name, user="u", host="h", created_at=start, backend="local",
        nodes=max(1, ranks // 8), spec={"bucket": {"scheme": "file", "name": bucket_dir}},
        task_yaml="", events=[*events, Event(kind="finish", time=end)],
    )  # fmt: skip
    save_record(record)
    folder = layout.run_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BACKEND_FILE).write_text(json.dumps({"backend": "local"}))
    assert record.ckpt_uri is not None
    shape = {"name": name, "token": f"{len(name):012x}", "task_id": f"t-{name}",
             "num_nodes": record.nodes, "procs_per_node": min(ranks, 8), "master_port": 29500,
             "ckpt_uri": record.ckpt_uri}  # fmt: skip
    save_launch(folder, LocalLaunch(**shape, run_id=run_id, workdir=".", run="true"))
    save_state(folder, LocalState(**shape, state=RunState.SUCCEEDED, started_at=start,
                                  ended_at=end, detail="succeeded"))  # fmt: skip
    uri = layout.series_uri(record.ckpt_uri, run_id)
    write_run(uri, ranks, launches, close=close, slow=slow, per_segment=per_segment)
    return uri


_watched: list[tuple[str, list[str]]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _watched and isinstance(args[0], str):
        for root, seen in _watched:
            if args[0].startswith(root):
                seen.append(args[0])


@contextlib.contextmanager
def opened_under(folder: Path) -> Iterator[list[str]]:
    """The files opened (or tried) under `folder` in the block: Python's `open` audit events
    (the hook is added once a process and looks only while a block watches)."""
    if not _watched and _audit not in _hooked:
        sys.addaudithook(_audit)
        _hooked.append(_audit)
    seen: list[str] = []
    _watched.append((str(folder), seen))
    try:
        yield seen
    finally:
        _watched.remove((str(folder), seen))


_hooked: list[Any] = []
