"""Did an attempt resume? The unit its nodes started with against where the script began.

A `--ckpt-dir` attempt starts with the unit the framework resumes from restored on every node
(`folderrestore.resume_unit`, e.g. `checkpoint-40/`). A script that resumes only when told
(run_clm.py without `--resume_from_checkpoint`, nanoGPT without `--init_from=resume`: see
`--resume-args`) trains from step 0 anyway. The supervisor polls the run's telemetry once a
second until the attempt's first word from rank 0 and compares:

    start event (the Trainer's, Lightning's callbacks: `resumed_from`)
                        resumed_from < 40             → restarted
    else its first step first step <= 40              → restarted
    a unit whose name has no step (`ckpt.pt`, `last.ckpt`): only step 0 / step 1 says so

A restart is an event (`scratch`) in the log and state.json: "attempt 2 started from scratch
although checkpoint-40 was committed"; `status` puts it before its detail and the demo
summary (`figures.py`) does not count that attempt as a resume. A script that reports no step
cannot be judged and is not.

`saved_line` names what a kill leaves to resume from: the newest complete checkpoint of
`CheckpointManager`, or the newest committed `--ckpt-dir` unit.
"""

from __future__ import annotations

import contextlib

from mncloud.storage.frameworkdirs import entry_step
from mncloud.telemetry.seriestail import SeriesTail

SCRATCH = "scratch"
"""The event kind of an attempt that did not resume from the unit its nodes started with."""


def restart_line(attempt: int, unit: str, resumed_from: int | None, first_step: int) -> str | None:
    """The `scratch` line when an attempt that started with `unit` did not resume from it."""
    step = entry_step(unit)
    began = resumed_from if resumed_from is not None else first_step - 1
    if step is None and began > 0:
        return None  # no step to compare with: only a start at 0 is known to be a restart
    if step is not None and began >= step:
        return None
    start = "from scratch" if began <= 0 else f"from step {began}"
    return f"attempt {attempt} started {start} although {unit.rstrip('/')} was committed"


class ResumeCheck:
    """One run's attempts, each judged once on rank 0's first step or `start` event."""

    def __init__(self, series_uri: str) -> None:
        self._tail = SeriesTail(series_uri)
        self._attempt: tuple[int, str, float] | None = None  # attempt, unit, its start

    def start(self, attempt: int, unit: str | None, started: float) -> None:
        """Attempt `attempt` began at `started` with `unit` restored (None: judge nothing)."""
        self._attempt = (attempt, unit, started) if unit else None

    def poll(self) -> str | None:
        """The `scratch` line once the attempt turns out to have restarted, else None."""
        if self._attempt is None:
            return None
        attempt, unit, started = self._attempt
        series = None
        with contextlib.suppress(Exception):  # an unreadable bucket: next poll
            series = self._tail.read()
        if series is None:
            return None
        start = next(
            (e for e in series.events
             if e.event == "start" and e.t >= started and e.rank == 0 and not e.node),
            None,
        )  # fmt: skip
        steps = [r.step for r in series.steps if r.t >= started and r.rank == 0 and not r.node]
        if start is None and not steps:
            return None
        self._attempt = None  # judged
        resumed = start.data.get("resumed_from") if start is not None else None
        first = min(steps, default=int(resumed or 0) + 1)
        return restart_line(attempt, unit, None if resumed is None else int(resumed), first)


def newest_complete_step(ckpt_uri: str) -> tuple[int | None, bool]:
    """The newest COMPLETE step of `CheckpointManager` in the bucket (None: none), and whether
    the bucket answered."""
    from mncloud.storage import CheckpointStore

    with contextlib.suppress(Exception):
        good, _ = CheckpointStore(ckpt_uri, retry_seconds=2).candidates()
        return (good[0] if good else None), True
    return None, False


def saved_line(step: int | None, unit: str | None, *, answered: bool = True) -> str:
    """What a kill leaves to resume from: "newest complete checkpoint: step 137", or the
    newest committed `--ckpt-dir` unit beside it (`unit`; None when the run has no folder);
    "unknown" when the bucket did not answer."""
    where = f"step {step}" if step is not None else "none"
    where = where if answered else "unknown (the bucket does not answer)"
    said = f"newest complete checkpoint: {where}"
    if unit is None or not answered:
        return said
    folder = f"newest committed --ckpt-dir unit: {unit or 'none'}"
    return folder if step is None else f"{said}, {folder}"
