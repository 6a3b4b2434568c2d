"""Training curves drawn on the server as SVG: each reported metric over steps across the
run's launches, and step time per node over wall time (`telemetry.curves.MetricsView`).

Each launch is its own polyline (a colour per launch), so a relaunch that redid steps 21..27
draws a second line over them; each relaunch is a dashed line at the step it resumed from.
Each node's step time is its own polyline over wall time: a straggler is a line apart. Texts
pass through `markupsafe.escape`; nothing is fetched.
"""

from __future__ import annotations

from markupsafe import Markup, escape

from mncloud.telemetry.curves import CurvePoint, MetricsView

WIDTH, HEIGHT = 900, 220
LEFT, RIGHT, TOP, BOTTOM = 60, 10, 12, 28
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


def _colour(k: int) -> str:
    return COLOURS[k % len(COLOURS)]


class _Scale:
    """Data (x, y) → SVG coordinates over the plot area."""

    def __init__(self, points: list[tuple[float, float]]) -> None:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        self.x0, self.x1 = min(xs), max(max(xs), min(xs) + 1e-9)
        self.y0, self.y1 = min(ys), max(max(ys), min(ys) + 1e-9)

    def x(self, v: float) -> float:
        return round(LEFT + (v - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT), 2)

    def y(self, v: float) -> float:
        return round(
            HEIGHT - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM), 2
        )


def _frame(scale: _Scale, label: str, x_label: str) -> list[str]:
    bottom = HEIGHT - BOTTOM
    return [
        f'<line x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" stroke="#9ca3af"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#9ca3af"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{scale.y1:.4g}</text>',
        f'<text x="{LEFT - 4}" y="{bottom}" text-anchor="end">{scale.y0:.4g}</text>',
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">{escape(x_label)}</text>',
        f'<text x="{LEFT + 4}" y="{TOP + 8}">{escape(label)}</text>',
    ]


def _svg(body: list[str], label: str, kind: str) -> Markup:
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="curve" data-kind="{escape(kind)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" font-family="sans-serif" font-size="11">'
        + "".join(body)
        + "</svg>"
    )


def _line(points: list[tuple[float, float]], colour: str, cls: str, title: str) -> str:
    coords = " ".join(f"{x},{y}" for x, y in points)
    return (
        f'<polyline class="{escape(cls)}" data-points="{len(points)}" points="{coords}" '
        f'fill="none" stroke="{colour}" stroke-width="1.5"><title>{escape(title)}</title>'
        "</polyline>"
    )


def metric_svg(name: str, points: list[CurvePoint], view: MetricsView) -> Markup:
    """One metric over steps: a polyline per launch, a dashed mark at each relaunch, and the
    previous run of the lineage (`view.previous`) as a grey line."""
    before = view.previous.metrics.get(name, []) if view.previous else []
    scale = _Scale([(p.step, p.value) for p in (*points, *before)])
    body = _frame(scale, name, "step")
    if before and view.previous is not None:
        line = [(scale.x(p.step), scale.y(p.value)) for p in before]
        body.append(_line(line, "#9ca3af", "previous", f"{name}, run {view.previous.run_id}"))
    for launch in sorted({p.launch for p in points}):
        mine = [(scale.x(p.step), scale.y(p.value)) for p in points if p.launch == launch]
        title = f"{name}, launch {launch}"
        body.append(_line(mine, _colour(launch - 1), f"launch launch-{launch}", title))
    for mark in view.launches[1:]:
        mx = scale.x(min(max(mark.first_step, scale.x0), scale.x1))
        text = f"relaunch {mark.launch} from step {mark.first_step}"
        body.append(
            f'<g class="relaunch"><line x1="{mx}" y1="{TOP}" x2="{mx}" y2="{HEIGHT - BOTTOM}" '
            f'stroke="#111827" stroke-dasharray="4 3"/><text x="{mx + 3}" y="{TOP + 20}">'
            f"{escape(text)}</text></g>"
        )
    return _svg(body, f"{name} over steps", f"metric-{name}")


def step_time_svg(view: MetricsView) -> Markup:
    """Seconds per step over wall time: a polyline per node."""
    every = [p for points in view.step_time.values() for p in points]
    t0 = min((p.t for p in every), default=0.0)
    scale = _Scale([(p.t - t0, p.value) for p in every] or [(0.0, 0.0)])
    body = _frame(scale, "seconds per step", "seconds since the first step")
    for k, (node, points) in enumerate(sorted(view.step_time.items())):
        line = [(scale.x(p.t - t0), scale.y(p.value)) for p in points]
        body.append(_line(line, _colour(k), f"node node-{node.split()[-1]}", node))
    return _svg(body, "step time per node", "step-time")


def curve_charts(view: MetricsView) -> dict[str, Markup]:
    """Every chart of a run's page: each metric, then step time (when there is any)."""
    charts = {name: metric_svg(name, pts, view) for name, pts in view.metrics.items() if pts}
    if any(view.step_time.values()):
        charts["step time"] = step_time_svg(view)
    return charts
