"""Spot preemption hazards per node-hour, measured on spot traces rather than guessed.

A trace (`mncloud.replay.Trace`) says how many spot nodes were held (preemption traces) or
could be held (availability traces) at each tick. Every drop from k to k' < k nodes is k − k'
node preemptions; the node-hours are the sum of the counts × the tick length. The hazard is
(preemptions + ½) / node-hours: the ½ (a Jeffreys prior) keeps a short trace without a single
preemption from claiming a hazard of zero.

Data source of the constants below: the traces published with *Can't Be Late* (Wu et al.,
NSDI 2024) in github.com/skypilot-org/spot-traces, as copied to ../shared/traces (AWS
p3.2xlarge / p3.16xlarge V100 spot, 2022-10 … 2023-08; GCP c3-88, 2023-04), all 11 files,
availability and preemption traces alike, computed by `hazards_from_files` and checked against
the files by tests/test_replay.py. They are 4–30× the 0.05/node-h the planner assumed before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mncloud.replay import Trace, load_trace

#: Spot hazard per node-hour by cloud, pooled over every trace of that cloud (see above):
#: aws 3,966 drops in 8,029 node-h; gcp none in 45.6 node-h (one c3-88 trace, 2 days).
TRACE_HAZARD_PER_HOUR: dict[str, float] = {"aws": 0.494, "gcp": 0.011}
#: By region, where the traces tell: aws us-east-1 (zones 1a/1c/1d/1f), us-east-2 (2a/2b),
#: us-west-2 (2a/2b); gcp us-central1.
TRACE_REGION_HAZARD_PER_HOUR: dict[tuple[str, str], float] = {
    ("aws", "us-east-1"): 0.68,
    ("aws", "us-east-2"): 0.33,
    ("aws", "us-west-2"): 0.563,
    ("gcp", "us-central1"): 0.011,
}
TRACE_SOURCE = "skypilot-org/spot-traces (Can't Be Late, NSDI 2024)"


@dataclass(frozen=True)
class TraceHazard:
    """Preemptions and node-hours measured on one trace file."""

    source: str
    cloud: str
    region: str
    kind: str  #: "preemption", "availability" or "trace" when the path does not say
    preemptions: int
    node_hours: float

    @property
    def hazard(self) -> float:
        """Preemptions per node-hour, with the ½ prior of the module docstring."""
        return (self.preemptions + 0.5) / self.node_hours if self.node_hours else float("inf")


def count(trace: Trace) -> tuple[int, float]:
    """(node preemptions, spot node-hours) in a trace: every drop in the node count."""
    data = np.asarray(trace.data, dtype=np.int64)
    drops = int(np.clip(data[:-1] - data[1:], 0, None).sum())
    return drops, float(data.sum()) * trace.gap / 3600


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
    out = []
    for raw in paths:
        path = Path(raw)
        trace = load_trace(path)
        preemptions, node_hours = count(trace)
        cloud, region, kind = describe(path, trace)
        out.append(TraceHazard(str(path), cloud, region, kind, preemptions, node_hours))
    return out


def pooled(items: Iterable[TraceHazard], *, by_region: bool = False) -> dict[object, float]:
    """Hazard per cloud (or per (cloud, region)), pooling preemptions and node-hours."""
    sums: dict[object, list[float]] = {}
    for item in items:
        key: object = (item.cloud, item.region) if by_region else item.cloud
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[0] += item.preemptions
        acc[1] += item.node_hours
    return {k: round((p + 0.5) / h, 3) for k, (p, h) in sums.items() if h > 0}


def spot_hazard(cloud: str, region: str | None = None) -> float | None:
    """The measured hazard for a cloud (and region when the traces cover it), else None."""
    if region is not None and (cloud, region) in TRACE_REGION_HAZARD_PER_HOUR:
        return TRACE_REGION_HAZARD_PER_HOUR[(cloud, region)]
    return TRACE_HAZARD_PER_HOUR.get(cloud)
