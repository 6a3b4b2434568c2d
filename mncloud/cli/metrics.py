"""`mncloud metrics RUN`: a run's reported metrics and step time per node, from its telemetry
in the bucket (`mncloud.telemetry.series`), as a table, JSON or followed: through each rank's
rollup, curves thinned to a bounded number of points; `--raw` reads every record."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated

import typer

from mncloud.cli._common import console, handle_errors, print_json
from mncloud.cli.options import Json

if TYPE_CHECKING:
    from mncloud.telemetry.curves import MetricsView

#: Seconds between reads of the bucket under --follow.
FOLLOW_S = 5.0

Follow = Annotated[
    bool, typer.Option("--follow", "-f", help="Keep reading the bucket; print new steps.")
]
Raw = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="Every record of every telemetry segment, not the curves thinned to at most 400 "
        "points each (read from each rank's rollup); reads the whole run.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add `metrics` to the app."""
    app.command("metrics")(metrics_command)


@handle_errors
def metrics_command(
    name: Annotated[str, typer.Argument(help="The run name.")],
    json_out: Json = False,
    follow: Follow = False,
    raw: Raw = False,
) -> None:
    """Print the metrics a run's script reports through mncloud.train (loss, …) over steps,
    across its launches, and each node's seconds per step; read from the run's bucket."""
    from mncloud.operate import run_metrics

    view = run_metrics(name, raw=raw)
    if json_out and not follow:
        print_json(view.model_dump(mode="json"))
        return
    shown: dict[str, tuple[int, int]] = {}
    while True:
        _print_new(view, shown, json_out)
        if not follow:
            return
        time.sleep(FOLLOW_S)
        view = run_metrics(name, raw=raw)


def _print_new(view: MetricsView, shown: dict[str, tuple[int, int]], json_out: bool) -> None:
    """Rows of the metrics not printed yet (past the newest (launch, step) printed of each
    curve: a thinned curve's earlier points change as it grows): one line per (step, launch),
    `--json`: JSON lines."""
    if not view.metrics and not view.step_time and not shown:
        console.print("no telemetry yet (mncloud.train.report(step, loss=…) writes it)")
        shown["-"] = (0, 0)
    rows: dict[tuple[int, int], dict[str, float]] = {}
    columns = [(name, name, pts) for name, pts in view.metrics.items()]
    columns += [(name, f"{name} s/step", pts) for name, pts in view.step_time.items()]
    for name, column, points in columns:
        for point in points:
            if (point.launch, point.step) > shown.get(name, (0, 0)):
                rows.setdefault((point.launch, point.step), {})[column] = point.value
        if points:
            shown[name] = max(shown.get(name, (0, 0)), *((p.launch, p.step) for p in points))
    for (launch, step), values in sorted(rows.items()):
        if json_out:
            typer.echo(json.dumps({"launch": launch, "step": step, **values}))
            continue
        cells = "  ".join(f"{k} {v:.6g}" for k, v in sorted(values.items()))
        console.print(f"launch {launch}  step {step:>7}  {cells}", markup=False, highlight=False)
    if view.skipped and "skipped" not in shown:
        shown["skipped"] = (view.skipped, 0)
        console.print(f"{view.skipped} torn or malformed telemetry segments skipped", markup=False)
