"""`mncloud down`: the deadline controller first (it takes the run down), then whatever of
the run is left, after a preemption notice so every rank saves the step it reached
(`notice_s`; 0 stops at once). A run this machine holds no record of is looked for by name
by each backend (`Backend.down_unrecorded`)."""

from __future__ import annotations

from mncloud.backends.registry import backend_for_run, backend_names, get_backend
from mncloud.errors import BackendError, MncloudError, RunNotFoundError
from mncloud.operate.status import RunView, prepend, run_status


def stop_run(run_name: str, notice_s: float = 0.0) -> RunView:
    """Stop a run (`mncloud down`) and return once nothing of it is left: its deadline
    controller (which takes the run down itself), then the run, after a preemption notice of
    `notice_s` seconds to its nodes (none under node recovery, where the ranks do not watch
    for one: they are stopped at once). A cloud run's notice goes through its bucket. A run
    this machine holds no record of: a cloud deadline run's training jobs (its controller's VM
    launched them) were cancelled by id from the controller's state (`control/down.py`); a run
    launched elsewhere: its live jobs of that name, by id (`Backend.down_unrecorded`)."""
    from mncloud.backends.registry import known_runs
    from mncloud.control.state import controlled_runs

    controlled = run_name in controlled_runs()
    said = None
    if controlled:
        from mncloud.control.start import stop

        said = stop(run_name, notice_s)
    if run_name not in known_runs():
        if not controlled:  # a cloud deadline run started elsewhere: SkyPilot names it
            from mncloud.control.down import stop_elsewhere

            said = stop_elsewhere(run_name, notice_s)
            controlled = said is not None
        return _stop_unrecorded(run_name, controlled, said)
    backend = backend_for_run(run_name)
    status = RunView(**dict(backend.down(run_name, notice_s=notice_s)))
    if said and not backend.runs_here:  # what the cloud controller's `stop` cancelled
        prepend(status, said)
    return status


def _stop_unrecorded(run_name: str, controlled: bool, said: str | None) -> RunView:
    """`down` of a run with no backend record here (see `stop_run`); `said`: what stopping
    its deadline controller did."""
    if controlled:  # `stop` took it all down (a cloud run's jobs by id, never by name)
        status = run_status(run_name)
        if said:
            prepend(status, said)
        return status
    missing: RunNotFoundError | None = None
    for name in backend_names():
        try:
            return RunView(**dict(get_backend(name).down_unrecorded(run_name)))
        except RunNotFoundError as err:
            missing = err  # the last backend's words: the one that looked furthest
        except MncloudError as err:
            raise BackendError(f"mncloud has no record of a run {run_name!r}, and {err}") from None
    raise missing or RunNotFoundError(f"no run {run_name!r}")
