"""`mncloud runs ls|show|cost` and `mncloud rerun`: read run records, relaunch one exactly."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from mncloud import layout
from mncloud.cli import options as opts
from mncloud.cli._common import console, fail, handle_errors, print_json, print_whole

if TYPE_CHECKING:
    from mncloud.records.model import RunRecord

app = typer.Typer(no_args_is_help=True, help="Run records: lineage, events and cost.")

RefArg = Annotated[str, typer.Argument(help="A run id, a unique prefix of one, or a run name.")]
BucketOpt = Annotated[
    str | None,
    typer.Option("--bucket", help="Also look in this bucket (s3://…, gs://…, file://…)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
#: Records `runs ls` lists unless told (the newest).
LS_LIMIT = 50
LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit",
        min=0,
        show_default=False,
        help=f"List the newest N records (default {LS_LIMIT}, with --json every one); "
        "0 lists every one.",
    ),
]
BreakdownOpt = Annotated[
    bool,
    typer.Option(
        "--breakdown",
        help="Split a run's node-hours and cost by what they bought: useful steps, redone "
        "steps, recovery, checkpoint stalls, waiting, idle (the goodput ledger).",
    ),
]


def register(main: typer.Typer) -> None:
    """Add the `runs` group, `rerun` and `doctor` (lineage and preflight) to the app."""
    from mncloud.cli import doctor as doctor_cli

    main.add_typer(app, name="runs", help="Run records: lineage, events and cost.")
    main.command("rerun")(rerun_command)
    doctor_cli.register(main)


def _all_records(bucket: str | None, limit: int = 0) -> tuple[list[RunRecord], int]:
    """The run records on this machine (their summaries: `records.index`) and, with
    `bucket`, in it; oldest first; with `limit`, the newest `limit`; and how many there are."""
    from mncloud.records.store import list_bucket_records, list_summaries

    if not bucket:
        return list_summaries(limit or None)
    records = list_summaries()[0]
    known = {r.run_id for r in records}
    records += [r for r in list_bucket_records(bucket) if r.run_id not in known]
    records.sort(key=lambda r: r.created_at)
    return (records[-limit:] if limit else records), len(records)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


@app.command("ls")
@handle_errors
def ls_command(bucket: BucketOpt = None, as_json: JsonOpt = False, limit: LimitOpt = None) -> None:
    """List run records on this machine (and in --bucket), the newest --limit of them."""
    from mncloud.records.ledger import cost_summary

    shown = (0 if as_json else LS_LIMIT) if limit is None else limit
    records, total = _all_records(bucket, shown)
    if as_json:
        print_json(
            [
                {
                    "run_id": r.run_id,
                    "name": r.name,
                    "user": r.user,
                    "created_at": r.created_at,
                    "backend": r.backend,
                    "commit": r.git.commit if r.git else None,
                    "dirty": r.git.dirty if r.git else None,
                    "last_event": r.events[-1].kind if r.events else None,
                    "cost": cost_summary(r).total,
                }
                for r in records
            ]
        )
        return
    if not records:
        console.print("No run records yet; `mncloud up` writes one for every run.")
        return
    # Stacked cells keep every field whole at 80 columns: id over user@backend, date over time.
    table = Table(title="run records", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("run id / by", "created", "commit", "last event", "cost"):
        table.add_column(col, justify="right" if col == "cost" else "left", no_wrap=True)
    for r in records:
        commit = "-"
        if r.git and r.git.commit:
            commit = r.git.commit[:10] + ("\n+dirty" if r.git.dirty else "")
        table.add_row(
            f"{r.run_id}\n{r.user}@{r.backend}",
            _when(r.created_at).replace(" ", "\n"),
            commit,
            r.events[-1].kind if r.events else "-",
            _money(cost_summary(r).total),
        )
    console.print(table)
    if total > len(records):
        console.print(f"the newest {len(records)} of {total:,} records; --limit 0 lists all")


@app.command("show")
@handle_errors
def show_command(ref: RefArg, bucket: BucketOpt = None, as_json: JsonOpt = False) -> None:
    """Show one run's lineage, events and step-time stragglers."""
    from mncloud.records.store import find_record
    from mncloud.telemetry.steps import STRAGGLER_FACTOR, step_times, straggler_ranks

    record = find_record(ref, bucket)
    times = step_times(record) if record.bucket_uri else dict(record.step_times)
    if as_json:
        data = record.model_dump(mode="json")
        data["step_times"] = times
        data["stragglers"] = straggler_ranks(times)
        print_json(data)
        return
    print_whole(_head_table(record))
    console.print(_events_table(record))
    if times:
        slow = straggler_ranks(times)
        line = ", ".join(f"{r}: {t:.3f}s" for r, t in sorted(times.items()))
        console.print(f"sustained step times by rank: {line}")
        if slow:
            console.print(f"[yellow]stragglers (≥ {STRAGGLER_FACTOR}× median): {slow}[/]")


def _head_table(record: RunRecord) -> Table:
    """Who launched what from which code, and where the record lives."""
    spec = record.spec
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("run", record.run_id)
    head.add_row("user", f"{record.user}@{record.host}")
    head.add_row("created", _when(record.created_at))
    head.add_row("backend", record.backend)
    accel = spec.get("accelerator") or {}
    head.add_row("request", f"{spec.get('nodes')} × {accel.get('name')}:{accel.get('count')}")
    if record.git:
        g = record.git
        state = "clean" if not g.dirty else f"diff {g.diff_bytes} B, {len(g.untracked)} untracked"
        head.add_row("code", f"{g.commit or '(no commit)'} on {g.branch or '-'} ({state})")
    else:
        head.add_row("code", "not a git repository")
    head.add_row("image", record.image or "-")
    head.add_row("labels", ", ".join(f"{k}={v}" for k, v in record.labels.items()) or "-")
    head.add_row("record", record.bucket_uri or str(layout.record_dir(record.run_id)))
    head.add_row("packages", str(len(record.packages)))
    return head


def _events_table(record: RunRecord) -> Table:
    """Every event of the run: where it ran, at what price."""
    events = Table(title="events")
    for col in ("time", "event", "node", "where", "market", "$/h", "detail"):
        events.add_column(col)
    for e in record.events:
        where = " ".join(x for x in (e.cloud, e.region, e.instance_type) if x) or "-"
        market = "-" if e.spot is None else ("spot" if e.spot else "on-demand")
        detail = e.detail or (f"step {e.step}" if e.step is not None else "")
        events.add_row(
            _when(e.time),
            e.kind,
            "-" if e.node is None else str(e.node),
            where,
            market,
            _money(e.hourly_price),
            detail,
        )
    return events


@app.command("cost")
@handle_errors
def cost_command(
    ref: Annotated[
        str | None,
        typer.Argument(
            help="A run id, a unique prefix of one, or a run name; all runs if omitted."
        ),
    ] = None,
    bucket: BucketOpt = None,
    as_json: JsonOpt = False,
    breakdown: BreakdownOpt = False,
) -> None:
    """Cost so far by segment (each launch until its end), spot vs on-demand, vs the plan.
    Without a run: one row per run (where, state, hours, cost so far) and the total.
    With --breakdown: the goodput ledger (where each node-hour and dollar went)."""
    from mncloud.records.ledger import cost_summary
    from mncloud.records.store import find_record

    if ref is None:
        if breakdown:
            raise fail("--breakdown needs a run: mncloud runs cost RUN --breakdown")
        _cost_report(_all_records(bucket)[0], as_json)
        return
    record = find_record(ref, bucket)
    if breakdown:
        _breakdown(record, as_json)
        return
    summary = cost_summary(record)
    if as_json:
        print_json(summary.model_dump(mode="json"))
        return
    table = Table(title=f"cost of {record.run_id}")
    for col in ("#", "from", "until", "where", "market", "hours", "$/h", "cost"):
        table.add_column(col, justify="right" if col in ("#", "hours", "$/h", "cost") else "left")
    for s in summary.segments:
        until = "now (running)" if s.open else f"{_when(s.end)} ({s.ended_by})"
        where = " ".join(x for x in (s.cloud, s.region, s.instance_type) if x) or "-"
        market = "-" if s.spot is None else ("spot" if s.spot else "on-demand")
        table.add_row(
            str(s.index),
            f"{_when(s.start)} ({s.opened_by})",
            until,
            where,
            market,
            f"{s.hours:.2f}",
            _money(s.hourly_price),
            _money(s.cost),
        )
    console.print(table)
    console.print(
        f"total {_money(summary.total)} = spot {_money(summary.spot)} + on-demand "
        f"{_money(summary.on_demand)}; {summary.preemptions} preemption(s), "
        f"{summary.restarts} relaunch(es)"
    )
    if summary.unpriced_hours:
        console.print(f"[yellow]{summary.unpriced_hours:.2f} h without a known price[/]")
    if summary.estimate is not None:
        console.print(f"plan's estimate for the whole job: {_money(summary.estimate)}")


def _breakdown(record: RunRecord, as_json: bool) -> None:
    """`runs cost RUN --breakdown`: the goodput ledger (`records/goodput.py`)."""
    from mncloud.operate import run_goodput
    from mncloud.records.goodput import part_label

    ledger = run_goodput(record)
    if as_json:
        print_json(ledger.model_dump(mode="json"))
        return
    total = ledger.total_node_seconds
    unit, scale = ("node-hours", 3600.0) if total >= 3600 else ("node-seconds", 1.0)
    table = Table(title=f"goodput of {record.run_id}", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("part", unit, "share", "cost", "steps"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for name, part in ledger.parts.items():
        if not part.node_seconds and not part.steps and name != "useful":
            continue
        share = f"{part.node_seconds / total:.1%}" if total else "-"
        steps = str(part.steps) if name in ("useful", "redone", "unsaved") else ""
        table.add_row(
            part_label(name), f"{part.node_seconds / scale:,.2f}", share,
            _money(part.cents / 100), steps,
        )  # fmt: skip
    table.add_section()
    table.add_row("total", f"{total / scale:,.2f}", "", _money(ledger.total_cost), "")
    console.print(table)
    good = "unknown" if ledger.goodput is None else f"{ledger.goodput:.1%}"
    per_k = ledger.cost_per_1k_useful_steps
    console.print(
        f"goodput {good} over {ledger.launches} launch(es)"
        + ("" if per_k is None else f"; {_money(per_k)} per 1,000 useful steps")
    )
    if ledger.unbilled_node_seconds:
        waited = ledger.unbilled_node_seconds / scale
        console.print(f"waited {waited:,.2f} {unit} with nothing billed (not in the total)")
    if ledger.unmeasured:
        console.print(f"[yellow]not measured: {', '.join(ledger.unmeasured)}[/]")
    for note in ledger.notes:
        console.print(f"[yellow]{note}[/]")


def _record_state(record: RunRecord, open_segment: bool) -> str:
    """A run's state as its record tells it: running (billed now), or its last event."""
    if open_segment:
        return "running"
    if not record.events:
        return "-"
    last = record.events[-1].kind
    return {"finish": "finished", "failure": "failed", "preemption": "preempted"}.get(last, last)


def _cost_rows(records: list[RunRecord]) -> list[dict[str, Any]]:
    from mncloud.records.ledger import cost_summary

    rows = []
    for r in records:
        summary = cost_summary(r)
        segments = summary.segments
        cloud = next((s.cloud for s in reversed(segments) if s.cloud), None)
        rows.append({
            "run_id": r.run_id, "name": r.name, "backend": r.backend, "cloud": cloud,
            "state": _record_state(r, bool(segments) and segments[-1].open),
            "hours": sum(s.hours for s in segments), "cost": summary.total,
            "spot": summary.spot, "on_demand": summary.on_demand,
            "unpriced_hours": summary.unpriced_hours,
        })  # fmt: skip
    return rows


def _cost_report(records: list[RunRecord], as_json: bool) -> None:
    """`runs cost` without a run: one row per run record and the total, like sky cost-report."""
    rows = _cost_rows(records)
    total = sum(r["cost"] for r in rows)
    hours = sum(r["hours"] for r in rows)
    if as_json:
        print_json({"runs": rows, "total": total, "hours": hours})
        return
    if not rows:
        console.print("No run records yet; `mncloud up` writes one for every run.")
        return
    table = Table(title="cost of every run", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("run / id", "where", "state", "hours", "cost"):
        table.add_column(col, justify="right" if col in ("hours", "cost") else "left")
    for r in rows:
        where = (
            r["backend"] if r["cloud"] in (None, r["backend"]) else f"{r['cloud']}/{r['backend']}"
        )
        table.add_row(
            f"{r['name']}\n{r['run_id']}", where, r["state"], f"{r['hours']:.2f}", _money(r["cost"])
        )
    table.add_section()
    table.add_row(f"total ({len(rows)} runs)", "", "", f"{hours:.2f}", _money(total))
    console.print(table)
    unpriced = sum(r["unpriced_hours"] for r in rows)
    if unpriced:
        console.print(f"[yellow]{unpriced:.2f} h without a known price (not in the total)[/]")


def _rerun_name(name: str) -> str:
    import secrets  # here: `mncloud --help` need not load hashlib and hmac

    return f"{name[:50].rstrip('-')}-rerun-{secrets.token_hex(2)}"


@opts.command(opts.LAUNCH)
@handle_errors
def rerun_command(
    ref: RefArg,
    name: Annotated[
        str | None, typer.Option("--name", help="Name of the new run (default NAME-rerun-XXXX).")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE for a value the record had to redact."),
    ] = None,
    skip_untracked: Annotated[
        bool,
        typer.Option("--skip-untracked", help="Go on without untracked files that changed."),
    ] = False,
    bucket: BucketOpt = None,
    **launch: Any,
) -> None:
    """Launch a recorded run again: same spec, same options, same commit, same diff."""
    from mncloud.cli.up import launch_and_follow
    from mncloud.launch import Existing
    from mncloud.records.rerun import prepare_rerun
    from mncloud.records.store import find_record
    from mncloud.request import parse_key_values

    record = find_record(ref, bucket)
    new_name = name or _rerun_name(record.name)
    setup = prepare_rerun(
        record,
        layout.rerun_dir(new_name),
        name=new_name,
        env_overrides=parse_key_values(env or [], "--env"),
        skip_untracked=skip_untracked,
    )
    if not launch["as_json"]:
        restored = setup.restored_untracked
        console.print(
            f"rebuilt {record.run_id} at {setup.worktree} "
            f"({record.git.commit[:10] if record.git and record.git.commit else '?'}"
            f"{' + diff' if record.git and record.git.diff_sha256 else ''}"
            f"{f', {len(restored)} untracked' if restored else ''})",
            soft_wrap=True,
        )
        if setup.skipped_untracked:
            console.print(f"[yellow]skipped untracked: {', '.join(setup.skipped_untracked)}[/]")
    launch_and_follow(
        setup.spec,
        setup.launch_options,
        existing=Existing.REFUSE,
        yes=launch["yes"],
        detach=launch["detach"],
        dryrun=launch["dryrun"],
        as_json=launch["as_json"],
    )
