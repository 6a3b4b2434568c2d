"""Every state SkyPilot can report maps to exactly one of ours, checked over SkyPilot's own enums:
a state a newer SkyPilot adds fails here, and is then mapped on purpose, not by a fallback."""

from __future__ import annotations

import pytest

from mncloud.backends.base import Failure, RunState
from mncloud.backends.skypilot.status import (
    CLUSTER_JOB_STATES,
    CLUSTER_STATES,
    FAILURES,
    MANAGED_JOB_STATES,
    failure_of,
    state_of,
)


def test_every_managed_job_status_is_mapped() -> None:
    from sky.jobs.state import ManagedJobStatus

    assert set(MANAGED_JOB_STATES) == {s.value for s in ManagedJobStatus}
    for status in ManagedJobStatus:
        ours = state_of(status, MANAGED_JOB_STATES)
        assert ours is MANAGED_JOB_STATES[status.value]
        if status is ManagedJobStatus.CANCELLING:  # asked to stop: over for the run already
            assert ours is RunState.CANCELLED and not status.is_terminal()
            continue
        assert ours.is_final is status.is_terminal(), status
        assert (ours is RunState.FAILED) is status.is_failed(), status
        assert (failure_of(status) is not None) is status.is_failed(), status


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        ("FAILED", Failure.USER),
        ("FAILED_SETUP", Failure.USER),
        ("FAILED_NO_RESOURCE", Failure.CAPACITY),
        ("FAILED_CONTROLLER", Failure.INFRA),
        ("FAILED_PRECHECKS", Failure.REFUSED),
    ],
)
def test_each_managed_job_failure_has_its_reaction(status: str, failure: Failure) -> None:
    from sky.jobs.state import ManagedJobStatus

    assert failure_of(ManagedJobStatus(status)) is failure


def test_every_cluster_status_and_cluster_job_status_is_mapped() -> None:
    from sky.skylet.job_lib import JobStatus
    from sky.utils.status_lib import ClusterStatus

    assert set(CLUSTER_STATES) == {s.value for s in ClusterStatus}
    live = [s for s in ClusterStatus if s is not ClusterStatus.STOPPED]
    assert not any(state_of(s, CLUSTER_STATES).is_final for s in live)
    assert state_of(ClusterStatus.STOPPED, CLUSTER_STATES) is RunState.CANCELLED
    assert set(CLUSTER_JOB_STATES) == {s.value for s in JobStatus}
    for status in JobStatus:
        ours = state_of(status, CLUSTER_JOB_STATES)
        assert ours.is_final is status.is_terminal(), status
        failed = status.value.startswith("FAILED")
        assert (ours is RunState.FAILED) is failed and (status.value in FAILURES) is failed


def test_a_state_newer_than_the_tables_still_maps() -> None:
    """At run time a state this SkyPilot lacks is not fatal (the tests above catch it)."""
    assert state_of("FAILED_SOMETHING_NEW", MANAGED_JOB_STATES) is RunState.FAILED
    assert failure_of("FAILED_SOMETHING_NEW") is Failure.USER
    assert state_of("BRAND_NEW", MANAGED_JOB_STATES) is RunState.PENDING


def test_exit_codes_in_a_failure_reason_are_told_apart() -> None:
    """SkyPilot names the program's exit codes in its reason: a refusal (116) is final; a
    storage outage (75) is said for what it is, recovered without spending --max-restarts."""
    from mncloud.backends.skypilot.status import exit_codes, exit_note, refused_by_exit

    outage = "Job exited with exit codes [75, 75]. Restarting the job (exit code(s) [75] ...)"
    assert exit_codes(outage) == [75, 75] and not refused_by_exit(outage)
    assert "exit 75 is a storage outage" in exit_note(outage)
    assert "not counted against --max-restarts" in exit_note(outage)
    refused = "Job exited with exit code 116 (user program failure)."
    assert refused_by_exit(refused) and exit_note(refused) == ""
    assert exit_codes("Job failed") == [] and exit_note("") == ""
