"""A run as `status`, `logs`, `down`, `metrics`, `runs` and ui/ see it, whichever backend runs
it: through `backends.base.Backend` and the registry only, with the run records
(`records/`) and a deadline run's controller state (`control.state`). No module here imports a
concrete backend (`tests/test_backend_interface.py` holds it).

    status.py     `status`: the backend's view + newest checkpoint, stragglers, bandwidth,
                  a deadline controller's view (`RunView`); unreadable runs as one row each
    logs.py       `logs`: --tail and --since over `Backend.logs`
    stop.py       `down`: the controller first, then the run; a run with no record here
    telemetry.py  steps, goodput and metrics off the telemetry segments and the record
"""

from __future__ import annotations

from mncloud.operate.logs import run_logs
from mncloud.operate.status import (
    CKPT_LOOKUP_SECONDS,
    UNREADABLE,
    RunView,
    UnreadableRun,
    all_statuses,
    known_run_names,
    newest_checkpoint_step,
    run_status,
)
from mncloud.operate.stop import stop_run
from mncloud.operate.telemetry import (
    run_goodput,
    run_metrics,
    run_series,
    run_telemetry,
    status_goodput,
    with_relaunches,
)

__all__ = [
    "CKPT_LOOKUP_SECONDS",
    "UNREADABLE",
    "RunView",
    "UnreadableRun",
    "all_statuses",
    "known_run_names",
    "newest_checkpoint_step",
    "run_goodput",
    "run_logs",
    "run_metrics",
    "run_series",
    "run_status",
    "run_telemetry",
    "status_goodput",
    "stop_run",
    "with_relaunches",
]
