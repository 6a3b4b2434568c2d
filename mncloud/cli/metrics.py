"""`mncloud metrics RUN`: a run's reported metrics and step time per node, from its telemetry
segments in the bucket (`mncloud.telemetry.series`), as a table, JSON or followed."""

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


def register(app: typer.Typer) -> None:
    """Add `metrics` to the app."""
    app.command("metrics")(metrics_command)


@handle_errors
def metrics_command(
    name: Annotated[str, typer.Argument(help="The run name.")],
    json_out: Json = False,
    follow: Follow = False,
) -> None:
    """Print the metrics a run's script reports through mncloud.train (loss, …) over steps,
    across its launches, and each node's seconds per step; read from the run's bucket."""
    from mncloud.operate import run_metrics

    view = run_metrics(name)
    if json_out and not follow:
        print_json(view.model_dump(mode="json"))
        return
    shown: dict[str, int] = {}
    while True:
        _print_new(view, shown, json_out)
        if not follow:
            return
        time.sleep(FOLLOW_S)
        view = run_metrics(name)


def _print_new(view: MetricsView, shown: dict[str, int], json_out: bool) -> None:
    """Rows of the metrics not printed yet: one line per (step, launch), `--json`: JSON lines."""
    if not view.metrics and not view.step_time and not shown:
        console.print("no telemetry yet (mncloud.train.report(step, loss=…) writes it)")
        shown["-"] = 0
    rows: dict[tuple[int, int], dict[str, float]] = {}
    columns = [(name, name, pts) for name, pts in view.metrics.items()]
    columns += [(name, f"{name} s/step", pts) for name, pts in view.step_time.items()]
    for name, column, points in columns:
        for point in points[shown.get(name, 0) :]:
            rows.setdefault((point.launch, point.step), {})[column] = point.value
        shown[name] = len(points)
    for (launch, step), values in sorted(rows.items()):
        if json_out:
            typer.echo(json.dumps({"launch": launch, "step": step, **values}))
            continue
        cells = "  ".join(f"{k} {v:.6g}" for k, v in sorted(values.items()))
        console.print(f"launch {launch}  step {step:>7}  {cells}", markup=False, highlight=False)
    if view.skipped and "skipped" not in shown:
        shown["skipped"] = view.skipped
        console.print(f"{view.skipped} torn or malformed telemetry segments skipped", markup=False)
