"""Spot preemption hazards per node-hour, measured on spot traces rather than guessed.

A trace (`mncloud.plan.traces.Trace`) says how many spot nodes were held (preemption traces) or
could be held (availability traces) at each tick. Every drop from k to k' < k nodes is k − k'
node preemptions; the node-hours are the sum of the counts × the tick length. The hazard is
(preemptions + ½) / node-hours: the ½ (a Jeffreys prior) keeps a short trace without a single
preemption from claiming a hazard of zero.

Data source of the constants below: the traces published with *Can't Be Late* (Wu et al.,
NSDI 2024) in github.com/skypilot-org/spot-traces, as copied to ../shared/traces (AWS
p3.2xlarge / p3.16xlarge V100 spot, 2022-10 … 2023-08; GCP c3-88, 2023-04), all 11 files,
availability and preemption traces alike, computed by `hazards_from_files` and checked against
the files by tests/test_replay.py. They are 4–30× the 0.05/node-h the planner assumed before.

A little evidence must not swing a plan: `planning_hazard` weighs each measurement by its
node-hours against the next broader one (region → cloud → all traces) as if that one had been
seen for `EVIDENCE_PRIOR_NODE_HOURS`, the gamma–Poisson blend `--learn` uses. So GCP's single
2-day CPU trace without a preemption (45.6 node-h) moves GCP only half way from the pooled
0.49 towards zero, while AWS's 8,029 node-h speak for themselves.

Spot *gaps* (how long spot stays away once gone, for the deadline planner's availability model,
`mncloud.deadline.pricing`): the internal runs of ticks offering fewer than the trace's node count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mncloud.plan.traces import Trace

#: (node preemptions, spot node-hours) by cloud, pooled over every trace of that cloud (see
#: above): aws all 10 V100 files; gcp one c3-88 trace, 2 days, without a preemption.
TRACE_COUNTS: dict[str, tuple[int, float]] = {"aws": (3966, 8029.18), "gcp": (0, 45.62)}
#: The same by region, where the traces tell: aws us-east-1 (zones 1a/1c/1d/1f), us-east-2
#: (2a/2b), us-west-2 (2a/2b); gcp us-central1.
TRACE_REGION_COUNTS: dict[tuple[str, str], tuple[int, float]] = {
    ("aws", "us-east-1"): (1125, 1655.52),
    ("aws", "us-east-2"): (1055, 3198.82),
    ("aws", "us-west-2"): (1786, 3174.83),
    ("gcp", "us-central1"): (0, 45.62),
}
#: Spot hazard per node-hour by cloud and by region: (preemptions + ½) / node-hours.
TRACE_HAZARD_PER_HOUR: dict[str, float] = {"aws": 0.494, "gcp": 0.011}
TRACE_REGION_HAZARD_PER_HOUR: dict[tuple[str, str], float] = {
    ("aws", "us-east-1"): 0.68,
    ("aws", "us-east-2"): 0.33,
    ("aws", "us-west-2"): 0.563,
    ("gcp", "us-central1"): 0.011,
}
#: Every trace pooled (3,966 preemptions in 8,074.8 node-h): the hazard assumed for a cloud
#: without a trace (azure, runpod, …): the only public GPU spot measurement there is, so a cloud
#: we know nothing about is taken to be no better than AWS.
DEFAULT_HAZARD_PER_HOUR = 0.491
#: How many node-hours the broader estimate is worth when a measurement is weighed against it.
EVIDENCE_PRIOR_NODE_HOURS = 50.0
#: Spot gaps over every trace (internal runs offering fewer than the trace's nodes): 1,601 gaps,
#: 3,299.05 h in all, mean 2.06 h (median about 30 min: most gaps are short, a few last a day).
TRACE_GAPS: tuple[int, float] = (1601, 3299.05)
MEAN_SPOT_GAP_HOURS = 2.06


@dataclass(frozen=True)
class TraceHazard:
    """Preemptions and node-hours measured on one trace file."""

    source: str
    cloud: str
    region: str
    kind: str  #: "preemption", "availability" or "trace" when the path does not say
    preemptions: int
    node_hours: float
    gaps: int = 0  #: internal runs of ticks offering fewer than the trace's node count
    gap_hours: float = 0.0  #: their total length

    @property
    def hazard(self) -> float:
        """Preemptions per node-hour, with the ½ prior of the module docstring."""
        return (self.preemptions + 0.5) / self.node_hours if self.node_hours else float("inf")


def count(trace: Trace) -> tuple[int, float]:
    """(node preemptions, spot node-hours) in a trace: every drop in the node count."""
    import numpy as np  # only when traces are read: `plan` answers from the constants

    data = np.asarray(trace.data, dtype=np.int64)
    drops = int(np.clip(data[:-1] - data[1:], 0, None).sum())
    return drops, float(data.sum()) * trace.gap / 3600


def gaps(trace: Trace) -> tuple[int, float]:
    """(spot gaps, their hours): internal runs of ticks offering fewer than the trace's nodes.

    A run touching the start or the end of the trace is cut off and left out.
    """
    import numpy as np

    data = np.asarray(trace.data)
    up = np.concatenate([[1], (data >= data.max()).astype(np.int8), [1]])
    edges = np.diff(up)
    starts, ends = np.flatnonzero(edges == -1), np.flatnonzero(edges == 1)
    inner = (starts > 0) & (ends < len(data))
    return int(inner.sum()), float((ends - starts)[inner].sum()) * trace.gap / 3600


def describe(path: Path, trace: Trace) -> tuple[str, str, str]:
    """(cloud, region, kind) of a trace: its metadata `cloud`/`region` keys, else its path.

    The spot-traces layout names them: `preemption/1-node/aws-04-22-2023/us-west-2b_v100_1.json`
    is AWS, zone us-west-2b (region us-west-2), a preemption trace.
    """
    meta = trace.metadata.model_extra or {}
    folder = path.parent.name.split("-")[0].lower()
    cloud = str(meta.get("cloud") or (folder if folder.isalpha() else "unknown"))
    zone = path.stem.split("_")[0]
    match = re.fullmatch(r"([a-z]+-[a-z]+-?\d+)-?[a-z]?", zone)
    region = str(meta.get("region") or (match.group(1) if match else "unknown"))
    kinds = [p for p in path.parts if p in ("preemption", "availability")]
    return cloud, region, kinds[-1] if kinds else "trace"


def hazards_from_files(paths: Iterable[str | Path]) -> list[TraceHazard]:
    """One TraceHazard per trace file (for `plan --hazards-from`); SpecError on a bad file."""
    from mncloud.plan.traces import load_trace

    out = []
    for raw in paths:
        path = Path(raw)
        trace = load_trace(path)
        preemptions, node_hours = count(trace)
        cloud, region, kind = describe(path, trace)
        n_gaps, gap_hours = gaps(trace)
        out.append(
            TraceHazard(str(path), cloud, region, kind, preemptions, node_hours, n_gaps, gap_hours)
        )
    return out


def counts(
    items: Iterable[TraceHazard], *, by_region: bool = False
) -> dict[Any, tuple[int, float]]:
    """(preemptions, node-hours) per cloud (or per (cloud, region)), pooled."""
    sums: dict[Any, tuple[int, float]] = {}
    for item in items:
        key: Any = (item.cloud, item.region) if by_region else item.cloud
        p, h = sums.get(key, (0, 0.0))
        sums[key] = (p + item.preemptions, h + item.node_hours)
    return sums


def pooled(items: Iterable[TraceHazard], *, by_region: bool = False) -> dict[Any, float]:
    """Hazard per cloud (or per (cloud, region)), pooling preemptions and node-hours."""
    return {
        k: round((p + 0.5) / h, 3)
        for k, (p, h) in counts(items, by_region=by_region).items()
        if h > 0
    }


def weigh(preemptions: float, node_hours: float, prior: float) -> float:
    """A measurement weighed against a prior worth `EVIDENCE_PRIOR_NODE_HOURS` node-hours."""
    h0 = EVIDENCE_PRIOR_NODE_HOURS
    return (preemptions + prior * h0) / (node_hours + h0)


@dataclass(frozen=True)
class Evidence:
    """Preemption counts by cloud and by region, and what to call them (`traces`, …)."""

    label: str
    by_cloud: Mapping[str, tuple[int, float]]
    by_region: Mapping[tuple[str, str], tuple[int, float]]

    @classmethod
    def of(cls, items: Iterable[TraceHazard], label: str) -> Evidence:
        items = list(items)
        return cls(label, counts(items), counts(items, by_region=True))

    def hazard(self, cloud: str, region: str | None, prior: float) -> tuple[float, str] | None:
        """(hazard, where it came from) at a place, or None when no count covers it.

        The region's counts are weighed against the rest of the cloud's (weighed against
        `prior`); a cloud without counts of its own takes those of unknown clouds, if any.
        """
        key = cloud if cloud in self.by_cloud else "unknown"
        if key not in self.by_cloud:
            return None
        p, h = self.by_cloud[key]
        rp, rh = self.by_region.get((key, region or ""), (0, 0.0))
        if rh <= 0:
            where = cloud if key == cloud else "traces of unknown clouds"
            return weigh(p, h, prior), f"{self.label}, {where}: {_counted(p, h)}"
        rest = weigh(p - rp, h - rh, prior)
        return weigh(rp, rh, rest), f"{self.label}, {key} {region}: {_counted(rp, rh)}"


def _counted(preemptions: float, node_hours: float) -> str:
    return f"{preemptions:,.0f} preemptions in {node_hours:,.1f} node-h"


#: The traces of this module's constants, as `Evidence`.
TRACES = Evidence("traces", TRACE_COUNTS, TRACE_REGION_COUNTS)


def measured_hazard(cloud: str, region: str | None) -> tuple[float, str]:
    """The planner's spot hazard at a place from the traces, else the documented default."""
    cloud = cloud.lower()
    found = TRACES.hazard(cloud, region, DEFAULT_HAZARD_PER_HOUR)
    if found is not None:
        return found
    return DEFAULT_HAZARD_PER_HOUR, f"default: no trace of {cloud}, every trace pooled"


def spot_hazard(cloud: str, region: str | None = None) -> float | None:
    """The measured hazard for a cloud (and region when the traces cover it), else None."""
    if region is not None and (cloud, region) in TRACE_REGION_HAZARD_PER_HOUR:
        return TRACE_REGION_HAZARD_PER_HOUR[(cloud, region)]
    return TRACE_HAZARD_PER_HOUR.get(cloud)
