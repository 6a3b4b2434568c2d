"""`mncloud status`, `logs`, `down`: operate runs whichever backend they run on."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mncloud.cli._common import console, handle_errors, print_json

if TYPE_CHECKING:
    from mncloud.operate import RunView, UnreadableRun


def register(app: typer.Typer) -> None:
    """Add `status`, `logs` and `down` to the app."""
    app.command("status")(status_command)
    app.command("logs")(logs_command)
    app.command("down")(down_command)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@handle_errors
def status_command(
    name: Annotated[str | None, typer.Argument(help="A run name; all runs when omitted.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C (see --every).")
    ] = False,
    every: Annotated[
        str, typer.Option("--every", help="With --watch: time between refreshes, e.g. 5s, 1m.")
    ] = "2s",
    watch_count: Annotated[
        int | None, typer.Option("--watch-count", min=1, hidden=True, help="Refreshes, then stop.")
    ] = None,
) -> None:
    """Show runs: state, where, nodes, restarts, newest checkpoint, cost so far, stragglers.
    A run whose files cannot be read is one UNREADABLE row with the reason."""
    from mncloud.cli.options import parse_duration

    interval = parse_duration(every, "--every", positive=True) or 2.0
    if not watch:
        _show_status(name, as_json)
        return
    refreshes = 0
    try:
        while True:
            if console.is_terminal and not as_json:
                console.clear()
                stamp = time.strftime("%H:%M:%S")
                console.print(f"[dim]{stamp}, every {every.strip()}; Ctrl-C to stop[/]")
            _show_status(name, as_json, one_line_json=True)
            refreshes += 1
            if watch_count is not None and refreshes >= watch_count:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _show_status(name: str | None, as_json: bool, *, one_line_json: bool = False) -> None:
    """Print the status of one run, or of all (a run that cannot be read: one row)."""
    from mncloud.operate import UnreadableRun, all_statuses, run_status, status_goodput
    from mncloud.telemetry.series import reads_shared

    with reads_shared():  # a run's telemetry read once: its stragglers, then its goodput
        shown = [run_status(name)] if name else all_statuses()
        statuses = [s for s in shown if not isinstance(s, UnreadableRun)]
        goodput = {s.name: status_goodput(s) for s in statuses}
    if as_json:
        data = [
            {
                **s.model_dump(mode="json"),
                **({} if isinstance(s, UnreadableRun) else _ckpt_dir_json(s)),
                **({} if isinstance(s, UnreadableRun) else {"goodput": goodput[s.name]}),
            }
            for s in shown
        ]
        if one_line_json:
            sys.stdout.write(json.dumps(data, default=str) + "\n")
            sys.stdout.flush()
        else:
            print_json(data)
        return
    if not shown:
        console.print("No runs yet. Start one: mncloud up train.py --cloud local --gpus cpu:2")
        return
    console.print(_status_table(shown, goodput))
    _deadline_table(statuses)
    _detail_lines(shown)


def _status_table(shown: list[RunView | UnreadableRun], goodput: dict[str, float | None]) -> Table:
    from mncloud.operate import UnreadableRun

    table = Table(title="mncloud runs", title_justify="left")
    # "started": how long ago the run began; "ran": how long it has run (to its end, if over);
    # "cost" over its goodput (the share of its node-hours in useful steps: `runs cost
    # --breakdown`), stacked so the table stays whole at 80 columns.
    for column in ("name", "state", "where", "restarts", "ckpt", "started", "ran", "cost"):
        wraps = column in ("where", "restarts")  # the others stay whole at 80 columns
        table.add_column(
            column,
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
            min_width=9 if column == "where" else None,
        )
    now = time.time()
    for s in shown:
        if isinstance(s, UnreadableRun):
            state = Text(s.state, style="bold red")
            table.add_row(s.name, state, s.backend or "-", "-", "-", "-", "-", "-")
            continue
        where = "/".join(p for p in (s.cloud, s.region, s.instance_type) if p) or s.backend
        where = f"{s.nodes}× {where}" + (" spot" if s.spot else "")
        cost = f"${s.cost_so_far:,.2f}" if s.cost_so_far is not None else "-"
        if (good := goodput.get(s.name)) is not None:
            cost += f"\n{good:.0%} good"
        ran = None if s.started_at is None else (s.ended_at or now) - s.started_at
        ago = None if s.started_at is None else now - s.started_at
        table.add_row(
            s.name,
            s.state.value,
            where,
            f"{s.restarts} ({s.preemptions} preempted)",
            _ckpt_cell(s),
            "-" if ago is None else f"{_duration(ago)} ago",
            _duration(ran),
            cost,
        )
    return table


def _ckpt_cell(s: RunView) -> str:
    """The ckpt column: the newest checkpoint's step, or a `--ckpt-dir` run's newest unit."""
    if s.ckpt_dir is not None and s.ckpt_dir.newest is not None:
        return s.ckpt_dir.newest
    return "-" if s.ckpt_step is None else str(s.ckpt_step)


def _ckpt_dir_json(s: RunView) -> dict[str, object]:
    """`--json`'s `ckpt_dir_files` and `ckpt_dir_incomplete` (the `ckpt_dir` view's)."""
    view = s.ckpt_dir
    return {
        "ckpt_dir_files": view.files if view else [],
        "ckpt_dir_incomplete": view.incomplete if view else [],
    }


def _detail_lines(shown: list[RunView | UnreadableRun]) -> None:
    """The free-text detail below the table, one line a run, where it has the full width."""
    from mncloud.operate import UnreadableRun

    for s in shown:
        if isinstance(s, UnreadableRun):
            console.print(
                Text(f"{s.name}: ", style="bold") + Text(s.detail, style="red"), soft_wrap=True
            )
        elif s.detail:
            style = "yellow" if s.stragglers else "dim"
            console.print(
                Text(f"{s.name}: ", style="bold") + Text(s.detail, style=style), soft_wrap=True
            )
    statuses = [s for s in shown if not isinstance(s, UnreadableRun)]
    for s in statuses:
        for tracker, link in s.trackers.items():
            line = Text(f"{tracker} run: {link}", style="dim")
            console.print(Text(f"{s.name}: ", style="bold") + line, soft_wrap=True)
    for s in statuses:
        if s.recovery == "node" and s.node_states:
            nodes = ", ".join(f"{n} {state}" for n, state in sorted(s.node_states.items()))
            quorum = ", ".join(map(str, s.quorum)) or "-"
            line = f"node recovery: nodes {nodes}; quorum [{quorum}]"
            console.print(
                Text(f"{s.name}: ", style="bold") + Text(line, style="dim"), soft_wrap=True
            )
    for s in statuses:
        if s.bandwidth:
            from mncloud.doctor.bandwidth import published

            figure = published(s.bandwidth)
            low, line = figure.short, f"network: {figure.line()}"
            console.print(
                Text(f"{s.name}: ", style="bold") + Text(line, style="yellow" if low else "dim"),
                soft_wrap=True,
            )
    for s in statuses:
        from mncloud.cli.ckpt import describe_files

        view = s.ckpt_dir
        if view is not None and view.files:
            line = f"--ckpt-dir holds {describe_files(view.files)}"
            console.print(
                Text(f"{s.name}: ", style="bold") + Text(line, style="dim"), soft_wrap=True
            )
        if view is not None and view.incomplete:
            torn = "; ".join(f"{u['name']} ({u['reason']})" for u in view.incomplete)
            line = f"--ckpt-dir keeps aside (incomplete, never restored): {torn}"
            console.print(
                Text(f"{s.name}: ", style="bold") + Text(line, style="yellow"), soft_wrap=True
            )


def _deadline_table(statuses: list[RunView]) -> None:
    """Deadline runs: mode, work done of the total, slack, cost against all on-demand."""
    rows = [s for s in statuses if s.deadline is not None]
    if not rows:
        return
    table = Table(title="deadline runs (hours of run time)", title_justify="left")
    for column in ("name", "mode", "work h", "slack h", "left h", "cost", "all on-demand"):
        table.add_column(column, no_wrap=True)
    for s in rows:
        d = s.deadline
        assert d is not None
        budget = f" of ${d.budget:,.2f}" if d.budget is not None else ""
        table.add_row(
            s.name,
            d.mode,
            f"{d.work_hours:.2f}/{d.total_hours:g}",
            f"{d.slack_hours:.2f}",
            f"{d.hours_left:.2f}",
            f"${d.cost:,.2f}{budget}",
            f"${d.all_on_demand_cost:,.2f}",
        )
    console.print(table)
    for s in rows:
        d = s.deadline
        assert d is not None
        split = f"spot ${d.spot_cost:,.2f} + on-demand ${d.on_demand_cost:,.2f}"
        line = f"{split}; {d.switches} switch(es), {d.preemptions} preemption(s); {d.controller}"
        if d.place_costs:  # across places: where the money went, and where it runs now
            by_place = ", ".join(f"{name} ${cost:,.2f}" for name, cost in d.place_costs.items())
            line += f"; by place: {by_place}" + (f"; now in {d.place}" if d.place else "")
        console.print(Text(f"{s.name}: ", style="bold") + Text(line, style="dim"), soft_wrap=True)


@handle_errors
def logs_command(
    name: Annotated[str, typer.Argument(help="The run name.")],
    node: Annotated[int | None, typer.Option("--node", help="Only this node's lines.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
    tail: Annotated[
        int | None,
        typer.Option("--tail", "-n", min=0, help="Only the last N lines (then new ones with -f)."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Only lines written since a time ago (10m, 2h) or a time (14:30, "
            "2026-05-01T14:30); local runs, to the second.",
        ),
    ] = None,
) -> None:
    """Print the run's output from all nodes, each line prefixed with node and rank."""
    from mncloud.operate import run_logs

    try:
        for line in run_logs(name, node, follow=follow, tail=tail, since=_since(since)):
            typer.echo(line)
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None


def _since(text: str | None) -> float | None:
    """`--since`: a duration ago (`10m`) or a time (`14:30` today, `2026-05-01T14:30`)."""
    import datetime as dt

    from mncloud.cli.options import parse_duration
    from mncloud.errors import SpecError

    if text is None:
        return None
    if text.strip()[-1:].isalpha() or text.strip().isdigit():
        return time.time() - (parse_duration(text, "--since", positive=True) or 0.0)
    try:
        if len(text.strip()) <= 8:  # HH:MM[:SS] today
            clock = dt.time.fromisoformat(text.strip())
            return dt.datetime.combine(dt.date.today(), clock).timestamp()
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}…"
        raise SpecError(
            f"--since {shown}: give a duration (10m, 2h) or a time (14:30, 2026-05-01T14:30)"
        ) from None


@handle_errors
def down_command(
    name: Annotated[str, typer.Argument(help="The run name.")],
    now: Annotated[
        bool,
        typer.Option("--now", help="Stop at once: no preemption notice, no last checkpoint."),
    ] = False,
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            help="How long the ranks get to save the step they reached (a preemption notice) "
            "before whatever is left is killed, e.g. 30s, 2m.",
        ),
    ] = "30s",
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (down never asks).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Stop the run and release its nodes; returns once nothing of the run is left. The ranks
    first get a preemption notice and save the step they reached (a cloud run's through its
    bucket; --now skips it); checkpoints stay in the bucket. A deadline run's controller stops
    first."""
    from mncloud.cli.options import parse_duration
    from mncloud.operate import stop_run

    del yes  # accepted as `up` and `ckpt rm` accept it: scripts pass it by habit
    notice_s = 0.0 if now else parse_duration(grace, "--grace") or 0.0
    status = stop_run(name, notice_s)
    if as_json:
        print_json(status.model_dump(mode="json"))
    else:
        console.print(
            f"[bold]{status.name}[/]: {status.state.value} {escape(status.detail)}", soft_wrap=True
        )
