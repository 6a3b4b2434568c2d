"""`plan`'s offer table (80 columns unless --wide) and its step breakdown (`--verbose`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from mncloud.cli import plan_rows

if TYPE_CHECKING:
    from rich.console import Console

    from mncloud.plan import Candidate, Plan


def offers_table(
    plan: Plan, shown: list[list[Candidate]], title: str, *, timed: bool, wide: bool, width: int
) -> Table:
    """The offers, one row per group. By default 80 columns hold it: the offer's text folds,
    figures never do; preemptions, checkpoint interval, per-node price and hours of work
    come with `--wide`."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        min_width=min(len(title), width),  # the title on one line where it fits
    )
    table.add_column("offer", overflow="fold", ratio=1)
    headers = ["$/h\nnode\njob" if wide else "$/h\njob"]
    headers += (["step s\nwork h"] if wide else ["step\ns"]) if timed else []
    headers += ["exp.\nhours", "exp.\ncost"]
    headers += ["exp.\npreempt.", "ckpt\nevery"] if wide else []
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True, min_width=5)
    several = len(plan.request.accelerators) > 1
    for group in shown:
        c = group[0]
        where = f"{c.cloud} {c.region}" + (f" +{len(group) - 1} regions" if len(group) > 1 else "")
        what = f"{c.instance_type} {c.accelerator} {c.market}" if several else None
        extra = f"\n{c.network}" if c.network else ""
        if c.parallel is not None and (wide or c.parallel.value != "ddp"):
            extra += f"\n{c.parallel.value.upper()}" + (
                f", {c.recompute} recompute" if c.recompute not in (None, "none") else ""
            )
        cells = [
            f"{c.hourly_per_node:,.2f}\n{c.hourly_total:,.2f}" if wide else f"{c.hourly_total:,.2f}"
        ]
        if timed:
            step = f"{c.step_seconds:.3g}"
            cells.append(f"{step}\n{c.work_hours:,.2f}" if wide else step)
        cells += [f"{c.expected_hours:,.1f}", f"${c.expected_cost:,.2f}"]
        if wide:
            cells += [f"{c.expected_preemptions:.2f}", plan_rows.duration(c.checkpoint_interval_s)]
        table.add_row(
            f"{where}\n{what or f'{c.instance_type} {c.market}'}{extra}",
            *cells,
            style="bold green" if plan.choice in group else None,
        )
    return table


def show_steps(console: Console, plan: Plan, rows: list[Candidate]) -> None:
    """The step-time model's inputs, and what each shown offer's step is made of."""
    from mncloud.plan import hardware
    from mncloud.plan.stepmodel import OP_SECONDS
    from mncloud.plan.timing import memory_text

    request, defaults = plan.request, hardware.model()
    w = request.workload
    assert w is not None
    mfu = f"{w.mfu:.2f} ({w.mfu_source})" if w.mfu else "each GPU type's published figure"
    console.print(
        f"step model ({request.workload_source}): {w.flops_per_step:.3g} FLOPs and "
        f"{w.ops_per_step:,} operators (×{OP_SECONDS * 1e6:g} µs) per GPU per step; gradients "
        f"{w.grad_bytes / 1e9:,.3g} GB all-reduced; memory {memory_text(w)}; MFU {mfu}; "
        f"overlap {defaults.overlap:g} of backward",
        highlight=False,
        style="dim",
    )
    table = Table(
        title="What each step is made of (seconds)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("offer", overflow="fold", ratio=1)
    for header in ("step", "compute", "comm.", "exposed", "bound", "MFU"):
        table.add_column(header, justify="right", no_wrap=True, min_width=7)
    seen: set[tuple[str, str]] = set()
    for c in rows:
        if (c.cloud, c.instance_type) in seen:
            continue
        seen.add((c.cloud, c.instance_type))
        table.add_row(
            f"{c.cloud} {c.instance_type} {c.accelerator}\n{c.network}".rstrip(),
            f"{c.step_seconds:.3g}",
            f"{c.compute_seconds:.3g}",
            f"{c.comm_seconds:.3g}",
            f"{c.exposed_comm_seconds:.3g}",
            c.bound.value if c.bound else "",
            f"{c.mfu:.2f}" if c.mfu is not None else "",
            style="bold green"
            if (c.cloud, c.instance_type) == (plan.choice.cloud, plan.choice.instance_type)
            else None,
        )
    console.print(table)
    sources = dict.fromkeys(c.mfu_source for c in rows if c.mfu_source)
    for source in sources:
        console.print(f"MFU: {source}", highlight=False, style="dim")
