"""Run records: what ran (lineage), how it was launched, where and at what price, how fast.

One module per job, each importable alone:

    model.py      RunRecord, Event, GitInfo: the record itself (pydantic)
    redact.py     secret redaction: nothing credential-shaped reaches a record
    lineage.py    git capture (commit, diff hash and copy, untracked files), packages
    store.py      the locked record store (this machine + the bucket copy), events
    ledger.py     billed segments, cost summary, spot hazards learned for `plan --learn`
    goodput.py    the goodput ledger: billed node-seconds and dollars split by what they bought
    rerun.py      rebuild a recorded run's tree in a worktree, with its spec and options
    series.py     the ranks' telemetry segments (steps, metrics, events): written by every
                  training process (`mncloud.train.steptime`), read by everything else
    seriestail.py a live series read as it grows (the local supervisor's polls)
    telemetry.py  per-rank step times and stragglers, off the segments; torch-free and light

The names below are importable from the package itself (`from mncloud.records import
create_record`); each loads only its own module, so `mncloud.records.telemetry` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "model": (
        "CLOSES_SEGMENT", "OPENS_SEGMENT", "Event", "EventKind", "GitInfo", "RecordError",
        "RunRecord", "UntrackedFile",
    ),
    "redact": ("REDACTED", "Redactor", "is_sensitive_name", "redactor_for", "spec_redactor"),
    "lineage": ("capture_git", "installed_packages"),
    "store": (
        "append_event", "create_record", "fetch_record", "find_record", "list_bucket_records",
        "list_records",
        "load_current", "load_diff", "new_run_id", "record_bandwidth", "record_export",
        "save_record",
    ),
    "ledger": (
        "CostSummary", "ObservedRun", "Segment", "cost_segments", "cost_summary",
        "observed_runs", "observed_spot_hazard",
    ),
    "goodput": ("GoodputLedger", "StepMark", "Telemetry", "goodput_ledger"),
    "rerun": ("RerunSetup", "prepare_rerun"),
    "telemetry": (
        "STRAGGLER_FACTOR", "step_times", "straggler_note", "straggler_ranks",
    ),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
