"""A run's telemetry as the curves `mncloud metrics` prints and the web view draws.

Pure: a `telemetry.series.Series` in (its rollups' thinned one, or every record for
`metrics --raw`), a `MetricsView` out. Each metric is one curve
over steps across launches (each point says its launch, so a relaunch and the steps it redid
show: launch 2 starts again at step 21 after launch 1 reached 27); step time is one line per
node over wall time (the node's lowest rank, mean seconds per step between its reports,
thinned to `MAX_POINTS`), so a straggling node is a line apart.
"""

from __future__ import annotations

import itertools

from pydantic import BaseModel, Field

from mncloud.telemetry.series import Series, StepRow

#: Points kept per curve (evenly thinned; the first and last always kept).
MAX_POINTS = 400


class CurvePoint(BaseModel):
    step: int
    value: float
    t: float
    launch: int
    """1 for the first launch, 2 for the first relaunch, …"""


class LaunchMark(BaseModel):
    launch: int
    t0: float
    """When its lowest rank's process started."""
    first_step: int
    last_step: int


class MetricsView(BaseModel):
    """Every reported metric over steps, step time per node over wall time, the launches."""

    run_id: str
    metrics: dict[str, list[CurvePoint]] = Field(default_factory=dict)
    step_time: dict[str, list[CurvePoint]] = Field(default_factory=dict)
    """`node 0`, `node 1`, …: seconds per step over time (`step` is the step reached)."""
    launches: list[LaunchMark] = Field(default_factory=list)
    segments: int = 0
    skipped: int = 0
    """Torn or malformed segments left out."""
    previous: MetricsView | None = None
    """The run before it in its rerun lineage (the same name's previous record), if any."""


def _thin(points: list[CurvePoint], most: int | None = MAX_POINTS) -> list[CurvePoint]:
    if most is None or len(points) <= most:
        return points
    stride = (len(points) - 1) / (most - 1)
    return [points[round(i * stride)] for i in range(most)]


def _step_times(rows: list[StepRow], launch_no: dict[str, int]) -> list[CurvePoint]:
    """One rank's mean seconds per step between consecutive reports of one launch."""
    out = []
    for a, b in itertools.pairwise(rows):
        if a.launch == b.launch and b.step > a.step and b.t > a.t:
            seconds = (b.t - a.t) / (b.step - a.step)
            out.append(CurvePoint(step=b.step, value=seconds, t=b.t, launch=launch_no[b.launch]))
    return out


def metrics_view(run_id: str, series: Series, most: int | None = MAX_POINTS) -> MetricsView:
    """The curves of one run's telemetry (module docstring), each thinned to `most` points
    (None: every one)."""
    launches = series.launches()
    launch_no = {tag: k + 1 for k, launch in enumerate(launches) for tag in launch.tags}
    view = MetricsView(run_id=run_id, segments=series.segments, skipped=series.skipped)
    view.launches = [
        LaunchMark(launch=k + 1, t0=x.t0, first_step=x.first_step, last_step=x.last_step)
        for k, x in enumerate(launches)
    ]
    for name in sorted(series.metrics):
        curve = [
            CurvePoint(step=p.step, value=p.value, t=p.t, launch=launch_no.get(p.launch, 1))
            for p in series.curve(name)
        ]
        view.metrics[name] = _thin(curve, most)
    by_node: dict[int, list[StepRow]] = {}
    for row in series.steps:
        by_node.setdefault(row.node if row.node is not None else row.rank, []).append(row)
    for node, rows in sorted(by_node.items()):
        low = min(r.rank for r in rows)
        view.step_time[f"node {node}"] = _thin(
            _step_times([r for r in rows if r.rank == low], launch_no), most
        )
    return view
