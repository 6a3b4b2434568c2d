"""What a local run did, in numbers: its live progress, what its relaunches cost, and whether
it ended with the weights of the same run without interruptions (the reference run).

The final weights are the script's `final.json`, or a `--ckpt-dir` run's newest committed
unit's (`storage.final.ckpt_dir_final`): the reference comparison works for both.
The figures come from the supervisor's events (state.json) and the run's telemetry segments
(`telemetry.series`: rank 0's steps and its `start` events, each node's `done`), which the
script's ranks write to the run's bucket as on a cloud. The demo summary, the tests and the
benchmarks in `bench/` read them here and nowhere else.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mncloud.backends.base import RecoveryFigures, ReferenceResult, RunProgress, RunState
from mncloud.backends.local.lifecycle import (
    REFERENCE_DIR,
    run_ended,
    start_reference,
    stop_folder,
)
from mncloud.backends.local.resumecheck import SCRATCH
from mncloud.backends.local.state import (
    LocalState,
    last_step,
    load_launch,
    load_state,
    series_uri,
)
from mncloud.constants import CKPT_DIR_ENV
from mncloud.layout import run_dir
from mncloud.storage.final import ckpt_dir_final, read_final
from mncloud.telemetry.series import Series, read_series

POLL_S = 0.25
#: The supervisor's events a recovery is timed from (to the first step trained after it).
HITS = ("chaos-preempt", "preempted", "error", "outage")


def progress_of(folder: Path, label: str | None = None, *, summary: bool = False) -> RunProgress:
    """A run folder's progress; with `summary`, its recovery figures too."""
    state = load_state(folder)
    ended = run_ended(folder)
    return RunProgress(
        name=label or state.name, state=state.state, ended=ended, attempt=state.attempt,
        restarts=state.restarts, preemptions=state.preemptions, step=last_step(folder),
        started_at=state.started_at, ended_at=state.ended_at, detail=state.detail,
        figures=recovery_figures(folder) if summary else None,
    )  # fmt: skip


def read_run_series(folder: Path) -> Series:
    """The run's telemetry (empty when it has none or its bucket cannot be read), compacted
    in its bucket as it is read (a local run writes a segment per rank every 0.5 s)."""
    uri = series_uri(folder)
    if uri is None:
        return Series()
    try:
        return read_series(uri, compact=True)
    except Exception:  # figures of what could be read: none
        return Series()


def _attempt_steps(
    state: LocalState, series: Series
) -> tuple[list[list[int]], list[float | None], list[int | None]]:
    """Per attempt: the steps trained, the time of the first, the step it resumed from. Rank 0
    of node 0 speaks for all (under node recovery each node has a rank 0)."""
    launches = [e.t for e in state.events if e.kind == "launch"]
    bounds = [*launches, float("inf")]
    steps: list[list[int]] = [[] for _ in launches]
    first_t: list[float | None] = [None for _ in launches]
    resumed: list[int | None] = [None for _ in launches]

    def attempt(t: float) -> int | None:
        return next((i for i in range(len(launches)) if bounds[i] <= t < bounds[i + 1]), None)

    for e in series.events:
        k = attempt(e.t)
        if k is not None and e.event == "start" and not e.node and resumed[k] is None:
            resumed[k] = int(e.data.get("resumed_from") or 0)
    for row in series.steps:
        k = attempt(row.t)
        if k is None or row.rank != 0 or row.node:
            continue
        steps[k].append(row.step)
        if first_t[k] is None:
            first_t[k] = row.t
    return steps, first_t, resumed


def _recoveries(
    launches: list[float], hits: list[float], steps: list[list[int]],
    first_t: list[float | None], resumed: list[int | None], restarted: set[int] = frozenset(),
) -> tuple[list[int], list[float]]:  # fmt: skip
    """Per recovery: the steps lost (trained before it, again after) and the seconds from its
    hit to the first step after. A relaunch may train nothing (its nodes met a storage
    outage): the next one counts from the last step trained and the hit not yet resumed from.
    An attempt in `restarted` (its number: it started over, `resumecheck.py`) resumed nothing."""
    bounds = [*launches, float("inf")]
    lost: list[int] = []
    resume_s: list[float] = []
    reached = max(steps[0], default=resumed[0] or 0) if launches else 0
    since: float | None = None
    for k in range(1, len(launches)):
        if resumed[k] is not None:
            lost.append(max(0, reached - resumed[k]))
        reached = max(steps[k], default=reached if resumed[k] is None else resumed[k])
        hit = [t for t in hits if bounds[k - 1] <= t < bounds[k]]
        since = since if since is not None else min(hit, default=None)
        if since is not None and first_t[k] is not None:
            if k + 1 not in restarted:
                resume_s.append(round(first_t[k] - since, 2))
            since = None
    return lost, resume_s


def recovery_figures(folder: Path) -> RecoveryFigures:
    """Summarise a local run (live or finished) for the demo summary, tests and bench."""
    state = load_state(folder)
    launches = [e.t for e in state.events if e.kind == "launch"]
    hits = [e.t for e in state.events if e.kind in HITS]
    series = read_run_series(folder)
    steps, first_t, resumed = _attempt_steps(state, series)
    scratch = {e.attempt: e.message for e in state.events if e.kind == SCRATCH}
    lost, resume_s = _recoveries(launches, hits, steps, first_t, resumed, set(scratch))
    cold = first_t[0] - launches[0] if launches and first_t[0] else None
    final = None
    with contextlib.suppress(Exception):
        final = final_of(folder, state.ckpt_uri)
    return RecoveryFigures(
        node_losses=sum(e.kind == "node-lost" for e in state.events),
        heal_s=[
            float(e.data["seconds"])
            for e in state.events
            if e.kind == "node-healed" and e.data.get("seconds") is not None
        ],
        replica_weights={
            e.node: str(e.data["weights_sha256"])
            for e in series.events
            if e.event == "done"
            and e.node is not None
            and {"node", "weights_sha256"} <= e.data.keys()
        },
        attempts=len(launches),
        restarts=state.restarts,
        preemptions=state.preemptions,
        outages=state.outages,
        wall_s=(state.ended_at or time.time()) - state.started_at if state.started_at else None,
        cold_start_s=round(cold, 2) if cold is not None else None,
        resume_s=resume_s,
        steps_lost=sum(lost),
        lost_per_recovery=lost,
        resumed_from=resumed,
        steps_per_attempt=steps,
        final=final,
        restarted=[scratch[a] for a in sorted(scratch)],
    )


def final_of(folder: Path, ckpt_uri: str) -> dict[str, Any] | None:
    """The run's final figures: its script's final.json; a `--ckpt-dir` run's without one,
    from its newest committed unit's weights (`storage.final.ckpt_dir_final`)."""
    final = read_final(ckpt_uri)
    if final is None and CKPT_DIR_ENV in load_launch(folder).envs:
        final = ckpt_dir_final(ckpt_uri)
    return final


def run_reference(
    run_name: str, on_progress: Callable[[RunProgress], None] = lambda _p: None
) -> ReferenceResult:
    """Run the task once more without chaos (`lifecycle.start_reference`) and wait for it,
    calling `on_progress` as it goes; Ctrl-C (or `up`'s SIGTERM, even while it starts) stops
    it, and is raised again."""
    ref = run_dir(run_name) / REFERENCE_DIR
    try:
        start_reference(run_name)
        while not (progress := progress_of(ref, "reference")).ended:
            on_progress(progress)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stop_folder(ref)
        raise
    state = load_state(ref)
    final = final_of(ref, state.ckpt_uri) if state.state is RunState.SUCCEEDED else None
    wall = (state.ended_at or 0) - state.started_at if state.started_at else None
    return ReferenceResult(
        state=state.state,
        weights_sha256=(final or {}).get("weights_sha256"),
        wall_s=wall,
        detail=state.detail,
    )
