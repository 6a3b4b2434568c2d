"""`mncloud up --cloud local` in the foreground: the run's log, a live status line, a summary.

The supervisor runs in its own process either way; following only reads the run folder. Ctrl-C
stops the run (a foreground local run is yours; use `--detach` to leave it running). When the
run succeeded after at least one restart and the script wrote `final.json` with the sha256 of
its weights, the same task runs once more without chaos and the two hashes are compared: the
proof that preemptions cost time, not correctness.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.live import Live
from rich.text import Text

from mncloud.backends.base import RunState, RunStatus, run_dir
from mncloud.backends.local import (
    PROGRESS_FILE,
    RUN_LOG,
    LocalBackend,
    LocalState,
    load_state,
    read_final,
    recovery_figures,
    start_reference,
    stop_folder,
)
from mncloud.cli._common import console


def _last_step(folder: Path) -> int | None:
    path = folder / PROGRESS_FILE
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4096))
        tail = f.read().decode(errors="replace")
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            return int(record["step"])
    return None


def _status_line(state: LocalState, folder: Path, label: str) -> Text:
    elapsed = time.time() - (state.started_at or time.time())
    step = _last_step(folder)
    parts = [
        f"{label}: {state.state.value}",
        f"attempt {state.attempt}",
        f"restarts {state.restarts}",
        f"step {step}" if step is not None else "no step yet",
        f"{elapsed:.0f}s",
    ]
    return Text(" | ".join(parts), style="bold cyan")


def _follow_folder(folder: Path, label: str, show_lines: bool) -> LocalState:
    """Print the folder's run.log (if `show_lines`) under a live status line until it ends."""
    path = folder / RUN_LOG
    state = load_state(folder)
    with Live(_status_line(state, folder, label), console=console, transient=True) as live:
        offset, buffer = 0, ""
        while True:
            state = load_state(folder)
            ended = LocalBackend._ended(folder)
            if path.exists():
                with open(path, errors="replace") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                buffer += chunk
                *lines, buffer = buffer.split("\n")
                if show_lines:
                    for line in lines:
                        console.print(line, markup=False, highlight=False, soft_wrap=True)
            live.update(_status_line(state, folder, label))
            if ended:
                if buffer and show_lines:
                    console.print(buffer, markup=False, highlight=False, soft_wrap=True)
                return state
            time.sleep(0.25)


def follow_local_run(name: str) -> RunStatus:
    """Follow a local run to its end, print the demo summary, and return its final status."""
    backend = LocalBackend()
    folder = run_dir(name)
    try:
        _follow_folder(folder, name, show_lines=True)
    except KeyboardInterrupt:
        console.print(f"[yellow]Ctrl-C: stopping {name}[/] (use --detach to leave a run running)")
        return backend.down(name)
    status = backend.status(name)
    if status.state is RunState.SUCCEEDED:
        _summary(name, folder)
    return status


def _summary(name: str, folder: Path) -> None:
    fig = recovery_figures(folder)
    console.rule(f"[bold]{name}[/]: summary")
    console.print(f"restarts:    {fig.restarts} ({fig.preemptions} preemption(s))")
    lost = " + ".join(str(n) for n in fig.lost_per_recovery)
    console.print(
        f"steps lost:  {fig.steps_lost}" + (f" ({lost})" if len(fig.lost_per_recovery) > 1 else "")
    )
    console.print(f"wall time:   {fig.wall_s:.1f} s" if fig.wall_s is not None else "wall time: -")
    if fig.cold_start_s is not None:
        resumes = ", ".join(f"{s:.1f} s" for s in fig.resume_s) or "-"
        console.print(f"cold start:  {fig.cold_start_s:.1f} s to the first step; "
                      f"preemption to resumed step: {resumes}")  # fmt: skip
    sha = (fig.final or {}).get("weights_sha256")
    if not sha:
        console.print("final weights: the script wrote no final.json with weights_sha256")
        return
    console.print(f"final weights: sha256 {sha[:16]}…")
    if fig.restarts == 0:
        console.print("no restart happened, so there is nothing to compare with a reference")
        return
    console.print("running the same task once more without chaos, for the reference…")
    ref = start_reference(name)
    try:
        state = _follow_folder(ref, "reference", show_lines=False)
    except KeyboardInterrupt:
        stop_folder(ref)
        console.print("[yellow]reference stopped[/]")
        return
    ref_final = read_final(state.ckpt_uri) if state.state is RunState.SUCCEEDED else None
    ref_sha = (ref_final or {}).get("weights_sha256")
    if not ref_sha:
        console.print(f"[red]the reference run did not finish ({state.detail})[/]")
        return
    wall = (state.ended_at or 0) - (state.started_at or 0)
    if ref_sha == sha:
        console.print(
            f"[bold green]final weights == uninterrupted reference[/] (sha256 {ref_sha[:16]}…, "
            f"reference took {wall:.1f} s)"
        )
    else:
        console.print(f"[bold red]final weights differ from the reference[/] ({ref_sha})")
