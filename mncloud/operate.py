"""A run's status as `mncloud status` shows it, whichever backend runs it: the backend's own
view, plus the newest complete checkpoint from the bucket and straggling ranks from the
telemetry the ranks publish."""

from __future__ import annotations

from mncloud.backends.base import RunStatus
from mncloud.backends.registry import backend_for_run
from mncloud.errors import MncloudError

#: How long `status` keeps trying a bucket before it reports it unreadable.
CKPT_LOOKUP_SECONDS = 5.0


def newest_checkpoint_step(uri: str) -> int | None:
    """The newest complete, verified checkpoint step under `uri`, or None."""
    from mncloud.storage import CheckpointStore

    good, _skipped = CheckpointStore(uri, retry_seconds=CKPT_LOOKUP_SECONDS).candidates()
    return good[0] if good else None


def run_status(run_name: str) -> RunStatus:
    """A run's status from its backend, with the newest checkpoint read from its bucket and
    the straggling ranks from its newest run record (none without a record)."""
    status = backend_for_run(run_name).status(run_name)
    if status.ckpt_uri and status.ckpt_step is None:
        try:
            status.ckpt_step = newest_checkpoint_step(status.ckpt_uri)
        except MncloudError as err:
            _prepend(status, f"checkpoints unreadable: {' '.join(str(err).split())[:120]}")
    _add_stragglers(status)
    return status


def _add_stragglers(status: RunStatus) -> None:
    from mncloud import records

    try:
        record = records.load_current(status.name)
    except MncloudError:
        return
    status.step_times = records.step_times(record, ckpt_uri=status.ckpt_uri)
    status.stragglers = records.straggler_ranks(status.step_times)
    note = records.straggler_note(status.step_times, status.stragglers)
    if note:
        _prepend(status, note)


def _prepend(status: RunStatus, note: str) -> None:
    status.detail = f"{note}; {status.detail}" if status.detail else note
