"""Cloud runs as SkyPilot managed jobs, on `tests/fakesky.py` (the real SDK signatures, the
client's own conversion, a stateful jobs table): recovery under `--max-restarts` whatever the
market, and what `down` guarantees (issue #33): every live job of the run cancelled by id,
waited for until SkyPilot reports it ended, said; a second `down` a no-op; bad input one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from mncloud.backends.base import RunState
from mncloud.backends.skypilot import SkyPilotBackend
from mncloud.backends.skypilot.cancel import cancel_jobs, live_job_ids
from mncloud.cli import app
from mncloud.errors import BackendError
from tests.test_skypilot import _launched, script  # noqa: F401 - a fixture

if TYPE_CHECKING:
    from tests.fakesky import FakeSky

pytestmark = pytest.mark.catalog
runner = CliRunner()


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cancel_jobs` polls SkyPilot; the fake moves on each read, so no read need wait."""
    from mncloud.backends.skypilot import cancel

    monkeypatch.setattr(cancel, "POLL_S", 0.0)


def _states(backend: SkyPilotBackend, reads: int) -> list[tuple[RunState, int, str]]:
    seen = []
    for _ in range(reads):
        status = backend.status("llm")
        seen.append((status.state, status.restarts, status.detail))
    return seen


# ------------------------------------------------------------------------------- recovery


def test_an_on_demand_job_failing_twice_then_succeeding_is_retried(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    """The managed job's own `job_recovery` (what SkyPilot's server loaded) restarts it after
    each of its program's errors, up to `--max-restarts`; mncloud shows each step."""
    from sky.jobs import ManagedJobStatus as S

    from tests.fakesky import ERROR

    backend = _launched(script, fake_sky, spot=False, max_restarts=2)
    fake_sky.script(7, [S.RUNNING, ERROR, S.RUNNING, ERROR, S.RUNNING, S.SUCCEEDED])

    seen = _states(backend, 6)

    assert [(state, restarts) for state, restarts, _ in seen] == [
        (RunState.RUNNING, 0),
        (RunState.RECOVERING, 0),
        (RunState.RUNNING, 1),
        (RunState.RECOVERING, 1),
        (RunState.RUNNING, 2),
        (RunState.SUCCEEDED, 2),
    ]
    assert "restart 1 of 2 on errors" in seen[1][2]
    task = fake_sky.job(7).tasks[0]  # as SkyPilot's server read the task's job_recovery
    assert task.max_restarts == 2 and task.recover_codes == [115, 75]


def test_a_job_failing_max_restarts_plus_one_times_ends_failed_with_the_count(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    from sky.jobs import ManagedJobStatus as S

    from tests.fakesky import ERROR

    backend = _launched(script, fake_sky, spot=False, max_restarts=2)
    fake_sky.script(7, [S.RUNNING, ERROR, S.RUNNING, ERROR, S.RUNNING, ERROR, S.RUNNING])

    *_, (state, restarts, detail) = _states(backend, 7)

    assert state is RunState.FAILED and restarts == 2
    assert "FAILED after 2 restarts (--max-restarts 2)" in detail
    assert "user program failure" in detail
    assert backend.status("llm").state is RunState.FAILED  # terminal: the script is over


def test_a_preempted_spot_job_recovers_without_spending_a_restart(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    from sky.jobs import ManagedJobStatus as S

    from tests.fakesky import PREEMPT

    backend = _launched(script, fake_sky, spot=True, max_restarts=0)
    fake_sky.script(7, [S.RUNNING, PREEMPT, S.RUNNING, PREEMPT, S.RUNNING, S.SUCCEEDED])
    *_, (state, restarts, _detail) = _states(backend, 6)
    assert state is RunState.SUCCEEDED and restarts == 2


# ----------------------------------------------------------------------------------- down


def test_two_jobs_with_one_name_are_cancelled_by_id(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    """SkyPilot cancels nothing by a name two live jobs share (and says so only in its
    server's log): `down` finds both ids and cancels those."""
    import sky
    from sky.jobs import ManagedJobStatus as S

    backend = _launched(script, fake_sky, spot=True)  # job 7
    other = fake_sky.add_job("llm", S.RUNNING)  # 8: the same name, launched elsewhere
    fake_sky.set_status(7, S.RUNNING)

    assert sky.get(sky.jobs.cancel(name="llm")) is None  # as SkyPilot: no error, no cancel
    assert "Multiple running jobs found with name 'llm'" in fake_sky.messages[-1]
    assert fake_sky.job(7).live and fake_sky.job(other).live
    fake_sky.calls.clear()

    status = backend.down("llm")

    assert fake_sky.called("jobs.cancel") == [((), {"job_ids": [7, 8]})]
    assert not fake_sky.job(7).live and not fake_sky.job(other).live
    assert fake_sky.job(7).tasks[0].status is S.CANCELLED
    assert status.state is RunState.CANCELLED
    assert status.detail.startswith("cancelled managed jobs 7, 8")
    again = backend.down("llm")
    assert again.detail.startswith("nothing to cancel") and again.state is RunState.CANCELLED
    assert len(fake_sky.called("jobs.cancel")) == 1  # the second down sent no cancel


def test_down_waits_until_skypilot_reports_the_jobs_ended(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    from sky.jobs import ManagedJobStatus as S

    _launched(script, fake_sky, spot=False)
    fake_sky.set_status(7, S.RUNNING)
    fake_sky.cancel_polls = 3  # CANCELLING for three queue reads
    slept: list[float] = []

    assert cancel_jobs([7], sleep=slept.append) == [7]

    assert len(slept) == 2 and fake_sky.job(7).tasks[0].status is S.CANCELLED
    assert cancel_jobs([7]) == [] and live_job_ids("llm") == []


def test_down_that_skypilot_does_not_confirm_in_time_says_what_is_still_live(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    from sky.jobs import ManagedJobStatus as S

    from mncloud.backends.skypilot.cancel import CancelError

    _launched(script, fake_sky, spot=False)
    fake_sky.set_status(7, S.RUNNING)
    fake_sky.cancel_polls = 1000
    with pytest.raises(CancelError, match=r"still shows 7 live after 0s") as caught:
        cancel_jobs([7], wait_s=0.0)
    assert caught.value.live == [7]


def test_down_of_a_run_without_a_record_here_cancels_its_jobs_by_id(
    fake_sky: FakeSky,
) -> None:
    """A run this machine holds no record of (a controller's VM launched it, or another
    machine): its live jobs, found by their exact name in SkyPilot's queue."""
    from sky.jobs import ManagedJobStatus as S

    mine = fake_sky.add_job("dl", S.RUNNING)
    ended = fake_sky.add_job("dl", S.SUCCEEDED)
    other = fake_sky.add_job("dl-control", S.RUNNING)  # another name: not the run's
    result = runner.invoke(app, ["down", "dl", "--now", "--json"])
    assert result.exit_code == 0, result.output
    assert fake_sky.called("jobs.cancel") == [((), {"job_ids": [mine]})]
    assert fake_sky.job(other).live and not fake_sky.job(mine).live
    assert ended != mine and f"cancelled managed job {mine}" in result.stdout
    again = runner.invoke(app, ["down", "dl", "--now"])
    assert again.exit_code == 0 and "nothing to cancel" in again.stdout


# ------------------------------------------------------------------------------ bad input


def test_down_of_a_name_nobody_knows_is_one_line_exit_2(fake_sky: FakeSky) -> None:
    result = runner.invoke(app, ["down", "nosuch", "--now"])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "nosuch" in line and "neither mncloud nor SkyPilot knows it" in line
    assert not fake_sky.called("jobs.cancel")


def test_down_with_the_api_server_unreachable_names_it_and_cancels_nothing(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    from sky.jobs import ManagedJobStatus as S

    _launched(script, fake_sky, spot=False)
    fake_sky.set_status(7, S.RUNNING)
    fake_sky.unreachable()
    result = runner.invoke(app, ["down", "llm", "--now"])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert fake_sky.server_url in line and "nothing was cancelled" in line
    assert "managed job 7 may still be live" in line
    assert fake_sky.job(7).live


def test_down_cut_off_after_the_cancel_says_which_jobs_are_still_live(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    from sky.jobs import ManagedJobStatus as S

    _launched(script, fake_sky, spot=False)
    other = fake_sky.add_job("llm", S.RUNNING)
    fake_sky.set_status(7, S.RUNNING)
    fake_sky.unreachable(after="jobs.cancel")
    result = runner.invoke(app, ["down", "llm", "--now"])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert fake_sky.server_url in line and "cancel of managed jobs 7, 8 sent" in line
    assert f"may still be live: 7, {other}" in line
    fake_sky.reachable()  # it comes back: down again confirms both ended
    again = runner.invoke(app, ["down", "llm", "--now"])
    assert again.exit_code == 0 and "nothing to cancel" in again.stdout
    assert not fake_sky.job(7).live and not fake_sky.job(other).live


def test_down_of_an_unknown_name_with_the_server_unreachable_is_one_line(
    fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote API server that cannot be reached: the name is not known here, and SkyPilot
    cannot be asked; one line naming the server."""
    from sky.server import common

    remote = "https://sky.example.com"
    monkeypatch.setattr(common, "get_server_url", lambda host=None: remote)
    fake_sky.unreachable()
    result = runner.invoke(app, ["down", "nosuch", "--now"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "no record of a run 'nosuch'" in line and remote in line


def test_a_launch_that_never_reached_skypilot_is_downed_without_asking_it(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
) -> None:
    fake_sky.unreachable()
    with pytest.raises(BackendError, match="unreachable"):
        _launched(script, fake_sky, spot=False)
    fake_sky.reachable()
    status = SkyPilotBackend().down("llm")
    assert status.state is RunState.FAILED and "never launched" in status.detail
    assert fake_sky.calls == []
