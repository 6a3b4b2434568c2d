"""`mncloud up --cloud local` in the foreground: the run's log, a live status line, a summary.

The supervisor runs in its own process either way; following reads the run through the
backend's interface (`logs`, `status`, and its `rehearsal()`: `progress`, `run_reference`),
never its files. Ctrl-C, SIGTERM (`timeout`) or SIGHUP stops the run (a foreground local run
is yours; use `--detach` to leave it running). When the run
succeeded after at least one restart and the script wrote `final.json` with the sha256 of its
weights (a `--ckpt-dir` run: its newest committed unit's weights, `storage.final`), the same
task runs once more without chaos and the two hashes are compared: the proof that
preemptions cost time, not correctness.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from rich.console import RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from mncloud.backends.base import (
    Backend,
    RecoveryFigures,
    ReferenceResult,
    RunProgress,
    RunState,
    RunStatus,
)
from mncloud.cli._common import Signalled, console, signals_interrupt
from mncloud.errors import MncloudError

LABEL_WIDTH = 14


def status_line(progress: RunProgress, label: str | None = None) -> Text:
    """One line under the log: state, attempt, restarts, step, elapsed time."""
    step = f"step {progress.step}" if progress.step is not None else "no step yet"
    parts = [
        f"{label or progress.name}: {progress.state.value}",
        f"attempt {progress.attempt}",
        f"restarts {progress.restarts}",
        step,
        f"{progress.elapsed_s:.0f}s",
    ]
    return Text(" | ".join(parts), style="bold cyan", overflow="ellipsis", no_wrap=True)


def _safe_line(read: Callable[[], RunProgress]) -> RenderableType:
    try:
        return status_line(read())
    except (MncloudError, OSError, ValueError):  # a state file between two writes
        return Text("")


def _grid() -> Table:
    """Label and value columns: a long value wraps inside its own column, never under the
    label (readable at 80 columns)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=LABEL_WIDTH, no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_table(progress: RunProgress) -> Table:
    """The figures of a finished run: restarts, steps lost, times, final weights."""
    grid = _grid()
    fig = progress.figures
    if fig is None:
        return grid
    outages = f", {_plural(fig.outages, 'storage outage')}" if fig.outages else ""
    grid.add_row("restarts", f"{fig.restarts} ({_plural(fig.preemptions, 'preemption')}{outages})")
    if fig.outages:
        met = "1 relaunch" if fig.outages == 1 else f"{fig.outages} relaunches"
        grid.add_row("storage outage", f"{met} waited for the bucket; --max-restarts untouched")
    lost = " + ".join(str(n) for n in fig.lost_per_recovery)
    extra = f" ({lost})" if len(fig.lost_per_recovery) > 1 else ""
    grid.add_row("steps lost", f"{fig.steps_lost}{extra}")
    grid.add_row("wall time", f"{fig.wall_s:.1f} s" if fig.wall_s is not None else "-")
    if fig.cold_start_s is not None:
        grid.add_row("cold start", f"{fig.cold_start_s:.1f} s to the first step")
    if fig.resume_s:
        times = ", ".join(f"{s:.1f} s" for s in fig.resume_s)
        grid.add_row("resumed in", f"{times} (preemption to resumed step)")
    for line in fig.restarted:
        grid.add_row("[red]not resumed[/]", line)
    sha = (fig.final or {}).get("weights_sha256")
    source = (fig.final or {}).get("weights_file")
    said = "no final.json with a sha256"
    if sha:
        said = f"sha256 {sha[:16]}…" + (f" ({source} in --ckpt-dir)" if source else "")
    grid.add_row("final weights", said)
    return grid


def reference_table(sha: str, ref: ReferenceResult) -> Table:
    """The verdict: the run's final weights against the uninterrupted reference run's."""
    grid = _grid()
    if not ref.weights_sha256:
        grid.add_row("reference", f"[red]did not finish[/] ({ref.state.value}: {ref.detail})")
    elif ref.weights_sha256 == sha:
        took = f" (it took {ref.wall_s:.1f} s)" if ref.wall_s is not None else ""
        grid.add_row("reference", f"[bold green]same final weights[/] as without "
                                  f"preemptions{took}")  # fmt: skip
    else:
        grid.add_row("reference", f"[bold red]final weights differ[/] (reference sha256 "
                                  f"{ref.weights_sha256[:16]}…)")  # fmt: skip
    return grid


def _print_log(backend: Backend, name: str) -> None:
    """Print the run's log under a live status line until the run ends."""
    rehearsal = backend.rehearsal()
    line = lambda: _safe_line(lambda: rehearsal.progress(name))  # noqa: E731
    with Live(get_renderable=line, console=console, transient=True, refresh_per_second=4):
        for text in backend.logs(name, follow=True):
            console.print(text, markup=False, highlight=False, soft_wrap=True)


def follow_local_run(backend: Backend, name: str) -> RunStatus:
    """Follow a run on this machine (`backend.runs_here`) to its end, print the demo summary,
    and return its final status. Ctrl-C, SIGTERM or SIGHUP stops it (`down`); after a signal
    the command then exits 128 + its number, as a shell's would."""
    with signals_interrupt():  # a foreground local run must not outlive its command
        try:
            _print_log(backend, name)
        except KeyboardInterrupt as stop:
            what = f"{stop}" if isinstance(stop, Signalled) else "Ctrl-C"
            console.print(f"[yellow]{what}: stopping {name}[/] (use --detach to leave a run "
                          "running)")  # fmt: skip
            for sig in (signal.SIGTERM, signal.SIGHUP):  # let the stop finish
                signal.signal(sig, signal.SIG_IGN)
            status = backend.down(name)
            if isinstance(stop, Signalled):
                console.print(f"[bold]{status.name}[/]: {status.detail or status.state.value}")
                raise SystemExit(128 + stop.signum) from None
            return status
        status = backend.status(name)
        if status.state is RunState.SUCCEEDED:
            _summary(backend, name)
    return status


def node_recovery_line(fig: RecoveryFigures) -> str:
    """Node recovery in one line: losses, heals, and whether the replicas ended equal."""
    hashes = set(fig.replica_weights.values())
    same = (
        f"every replica's final weights equal (sha256 {next(iter(hashes))[:16]}…)"
        if len(hashes) == 1
        else f"[red]replicas' final weights differ ({len(hashes)} versions)[/]"
    )
    heals = ", ".join(f"{s:.2f} s" for s in fig.heal_s) or "none needed"
    return (
        f"node recovery: {fig.node_losses} node(s) lost and replaced alone while the others "
        f"trained on; heals from a live peer: {heals}; {same}"
    )


def ckpt_dir_line(name: str, uri: str | None) -> str | None:
    """A `--ckpt-dir` run's newest checkpoint (under its checkpoint URI `uri`), the one a
    relaunch resumes from, in one line (None without `--ckpt-dir` or a readable bucket)."""
    from mncloud.operate.status import newest_ckpt_dir_entry
    from mncloud.records.store import load_current

    try:
        record = load_current(name)
        uri = uri or record.ckpt_uri
        if not record.spec.get("ckpt_dir") or not uri:
            return None
        entry = newest_ckpt_dir_entry(uri)
    except (MncloudError, OSError):
        return None
    where = f"--ckpt-dir {record.spec['ckpt_dir']}"
    if entry is None:
        return f"newest checkpoint in {where}: none named by a step"
    return f"newest checkpoint in {where}: {entry.name} (step {entry.step})"


def goodput_line(name: str) -> str | None:
    """Where the run's node-seconds went, in one line (`runs cost ID --breakdown` in full)."""
    from mncloud.errors import MncloudError
    from mncloud.operate import run_goodput
    from mncloud.records.goodput import part_label
    from mncloud.records.store import load_current

    try:
        record = load_current(name)
        ledger = run_goodput(record)
    except MncloudError:
        return None
    if ledger.total_node_seconds <= 0:
        return None
    if ledger.goodput is None:
        if "useful" not in ledger.unmeasured:
            return None
        return (
            f"goodput unknown: the script reports no steps ({ledger.total_node_seconds:,.0f} "
            "node-seconds; a framework's trainer reports them with mncloud's callback, "
            "docs/guides/trainers.md)"
        )
    total = ledger.total_node_seconds
    shares = sorted(
        ((part.node_seconds / total, key) for key, part in ledger.parts.items()
         if key != "useful" and part.node_seconds >= total / 200),  # 0.5 % or more
        reverse=True,
    )  # fmt: skip
    rest = ", ".join(f"{part_label(key)} {share:.0%}" for share, key in shares[:3])
    return (
        f"goodput {ledger.goodput:.0%} of {ledger.total_node_seconds:,.0f} node-seconds "
        f"({rest}): mncloud runs cost {record.run_id} --breakdown"
    )


def tracker_lines(name: str) -> list[str]:
    """`<tracker> run: <link>` for each tracker run the run's newest record names."""
    from mncloud.errors import MncloudError
    from mncloud.records.store import load_current
    from mncloud.records.trackers import tracker_links

    try:
        links = tracker_links(load_current(name))
    except MncloudError:
        return []
    return [f"{tracker} run: {link}" for tracker, link in links.items()]


def _summary(backend: Backend, name: str) -> None:
    rehearsal = backend.rehearsal()
    progress = rehearsal.progress(name, summary=True)
    console.rule(f"[bold]{name}[/]: summary")
    console.print(summary_table(progress))
    fig = progress.figures
    sha = (fig.final or {}).get("weights_sha256") if fig else None
    if fig and fig.node_losses:
        console.print(node_recovery_line(fig), soft_wrap=True)
    folder = ckpt_dir_line(name, backend.status(name).ckpt_uri)
    if folder:
        console.print(folder, markup=False, highlight=False, soft_wrap=True)
    goodput = goodput_line(name)
    if goodput:  # its command whole: a user copies it
        console.print(goodput, markup=False, highlight=False, soft_wrap=True)
    for line in tracker_lines(name):  # a link whole: a user opens it
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not sha or not fig or fig.restarts == 0:
        if sha:
            console.print("no restart happened: nothing to compare with a reference run")
        return
    console.print("running the same task once more without chaos, for the reference…")
    with Live(Text(""), console=console, transient=True) as live:
        try:
            ref = rehearsal.run_reference(name, lambda p: live.update(status_line(p, "reference")))
        except KeyboardInterrupt as stop:  # run_reference stopped it
            live.stop()
            console.print("[yellow]reference stopped[/]")
            if isinstance(stop, Signalled):
                raise SystemExit(128 + stop.signum) from None
            return
    console.print(reference_table(sha, ref))
