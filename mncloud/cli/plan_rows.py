"""What `mncloud plan` prints, as data: grouped rows, the JSON, short cells (no printing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mncloud.deadline.pricing import DeadlineReport, PlaceEstimate
    from mncloud.plan import Candidate, Plan


def json(plan: Plan, report: DeadlineReport | None, top: int | None) -> dict[str, object]:
    """The plan's JSON; with a deadline, its figures per candidate and in `deadline`."""
    data = plan.to_json(top=top)
    if report is None:
        return data
    data["deadline"] = report.model_dump(mode="json") | {"warning": report.over_budget()}
    for c, entry in zip(plan.candidates, data["candidates"], strict=False):
        place = report.for_candidate(c)
        entry["deadline"] = None if place is None else place.model_dump(mode="json")
    choice = report.for_candidate(plan.choice)
    data["choice"]["deadline"] = None if choice is None else choice.model_dump(mode="json")
    return data


def top_note(rows: int, top: int) -> str | None:
    """What `--top` left out, or that fewer offers fit than it asked for."""
    if rows > top:
        return f"({rows - top} more; drop --top to see all)"
    if rows < top:
        return f"(only {rows} offer(s) fit, fewer than --top {top}: all are shown)"
    return None


def same_place_groups(places: list[PlaceEstimate]) -> list[list[PlaceEstimate]]:
    """Consecutive places that differ only in region, with the same figures, grouped."""
    groups: list[list[PlaceEstimate]] = []
    for p in places:
        last = groups[-1][0] if groups else None
        key = (p.cloud, p.instance_type, p.expected_cost, p.on_demand_cost, p.spot_only_cost)
        if last is not None and key == (
            last.cloud,
            last.instance_type,
            last.expected_cost,
            last.on_demand_cost,
            last.spot_only_cost,
        ):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def same_offer_groups(rows: list[Candidate]) -> list[list[Candidate]]:
    """Consecutive offers that differ only in region, at the same price, grouped together."""
    groups: list[list[Candidate]] = []
    for c in rows:
        last = groups[-1][0] if groups else None
        same = last is not None and (
            (last.cloud, last.instance_type, last.spot, last.hourly_per_node, last.expected_cost)
            == (c.cloud, c.instance_type, c.spot, c.hourly_per_node, c.expected_cost)
        )
        if same:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes / 60:.1f} h" if minutes >= 90 else f"{minutes:.0f} min"
