"""The cloud fault soak's ledger check (`tests/cloudsoak.py`): the ledger's billed seconds,
every controller home's records of the run each read up to when its VM went, equal the
seconds the fake's VMs ran the training jobs, within one tick.

A launch is billed from its `launch` event until a look reads the queue (`ledger.catch_up`:
waiting unbilled), and a stint from when it ran until a look sees it end. A controller that
hands off, or dies, before its next look leaves that guess open in its home; the home that
took the record over (it holds the same event and what the queue said after it) bills the
launch instead (`_superseded`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from mncloud.records.ledger import Segment
from mncloud.records.model import RunRecord
from tests.fakesky import FakeSky
from tests.test_control import GAP

if TYPE_CHECKING:
    from tests.cloudsoak import Report


def money_kept(
    fake: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
    homes: list[tuple[str, float]],
    report: Report,
    bucket: str,
) -> None:
    """The ledger bills what the VMs ran, within one tick: per launch (run id), the union of
    the segments every home's record of it bills, each home's read up to when it went, and
    the bucket's copies (what every later reader sees) read at the end, after `down`; but a
    segment still open when its home went (`_superseded`) as the copy that took the record
    over bills it."""
    from mncloud.records.store import list_bucket_records, list_records

    held: list[tuple[float, list[RunRecord]]] = []
    for home, went in homes:
        monkeypatch.setenv("MNCLOUD_HOME", home)
        held.append((went, list_records("llm")))
    end = max(went for _home, went in homes)
    held.append((end + 1.0, [r for r in list_bucket_records(bucket) if r.name == "llm"]))
    spans: dict[str, list[tuple[float, float]]] = {}
    for went, records in held:
        for record in records:
            billed = spans.setdefault(record.run_id, [])
            billed.extend(_billed(record, went, held))
    report.billed_s = sum(_union(billed) for billed in spans.values())
    report.ran_s = sum(_ran_s(fake, j) for j in fake.jobs if fake.job(j).name == "llm")
    if abs(report.billed_s - report.ran_s) > GAP:
        report.violations.append(
            f"billed {report.billed_s:.0f} s, the VMs ran {report.ran_s:.0f} s"
        )


def _billed(
    record: RunRecord, went: float, held: list[tuple[float, list[RunRecord]]]
) -> list[tuple[float, float]]:
    """The spans `record` bills, read up to `went` (when its home went), less a launch's
    segment `_superseded` there."""
    from mncloud.records.ledger import cost_segments

    segments = cost_segments(record, went)
    if segments and _superseded(record, segments[-1], went, held):
        segments = segments[:-1]
    return [(s.start, min(s.end, went)) for s in segments]


def _superseded(
    record: RunRecord, last: Segment, went: float, held: list[tuple[float, list[RunRecord]]]
) -> bool:
    """Whether `last`, `record`'s segment still open when its home went at `went`, is one a
    later home's record of the same launch followed on (it holds the event that opened it
    and more after it): that home read the queue since, and its account replaces the guess
    left open. A controller that hands off or dies before its next look leaves one behind:
    a `launch` no look saw, or a stint that ended after its last look (a later controller
    closes that at SkyPilot's end, `billing.close_earlier`); the product's own count then
    goes on from that later record."""
    if not last.open:
        return False
    for later, records in held:
        for other in records:
            if later <= went or other.run_id != record.run_id:
                continue
            opener = [i for i, e in enumerate(other.events)
                      if e.kind == last.opened_by and e.time == last.start]  # fmt: skip
            if opener and opener[0] < len(other.events) - 1:
                return True
    return False


def _ran_s(fake: FakeSky, job: int) -> float:
    """Seconds the job's VMs ran it, in the ledger's unit (a record's price is all nodes'): a
    job group's, the mean of its node tasks' (task 0, the lighthouse, is not in the price)."""
    ran = fake.running_seconds(job)
    return ran[0] if len(ran) == 1 else sum(ran[1:]) / len(ran[1:])


def _union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by `spans` (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total, reach = total + end - start, end
    return total
