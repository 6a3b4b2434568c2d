"""The last ways to a second gang, or a bill or a verdict that is not what ran (issue #52):
each reproduced on `tests/fakesky/` (a held request, a server-failed request, a controller job
that died), through the same CLI, controller and backend a user runs. Point 1 is in
`test_ledger_times.py` (the money of a failed node's group)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sky import exceptions as sx
from sky.jobs import ManagedJobStatus as S

from mncloud.backends.base import Failure, RunState
from mncloud.backends.skypilot import SkyPilotBackend
from mncloud.backends.skypilot.meta import load_meta
from mncloud.control import lease
from mncloud.errors import BackendError
from tests.fakesky import FakeSky
from tests.test_control_cloud import Driver, _fresh_vm, _named, _state
from tests.test_control_faults import _up_deadline
from tests.test_lease_in_flight import server_finishes_while_waiting
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog


def _one_line(result: object) -> str:
    """The refusal's one stderr line (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "Traceback" not in result.output  # type: ignore[attr-defined]
    (line,) = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    return line


def test_up_again_while_the_first_ups_controller_launch_is_in_flight_is_refused(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 2: Ctrl-C during `up --deadline` (the controller's launch request held in
    flight on the server), then `up` again: one line naming the request, `status`, `down` and
    `--replace`; never a second controller. `--replace` waits for that launch, cancels it,
    and launches one; one still in flight after `lease.LAUNCH_WAIT_S` refuses it in one line,
    nothing launched or cancelled (before: `sky.get` of the request, unbounded)."""
    from mncloud.backends.skypilot import host

    def sent_then_interrupted(self: object, run_name: str, config: dict, secrets: dict) -> None:
        import sky

        task = sky.Task.from_yaml_config(config)
        sky.jobs.launch(task, name=f"{run_name}-control")
        raise KeyboardInterrupt  # Ctrl-C while `up` waited for the answer

    fake_sky.held.add("jobs.launch")
    with monkeypatch.context() as patch:
        patch.setattr(host.SkyPilotHost, "launch_controller", sent_then_interrupted)
        assert _up_deadline(monkeypatch, script, tmp_path).exit_code != 0
    assert fake_sky._in_flight and fake_sky.jobs == {}

    line = _one_line(_up_deadline(monkeypatch, script, tmp_path, "--resume"))
    assert "being launched" in line and "mncloud down llm" in line and "--replace" in line
    fake_sky.finish_in_flight()
    assert len(fake_sky.live_jobs("llm-control")) == 1

    fake_sky.held.add("jobs.launch")  # once more in flight; --replace waits for it
    with monkeypatch.context() as patch:
        patch.setattr(host.SkyPilotHost, "launch_controller", sent_then_interrupted)
        _up_deadline(monkeypatch, script, tmp_path, "--replace")
    fake_sky.held.clear()
    (request_id,) = fake_sky._in_flight
    waited = server_finishes_while_waiting(monkeypatch, fake_sky, None, None)  # never finished
    before = _statuses(fake_sky)
    line = _one_line(_up_deadline(monkeypatch, script, tmp_path, "--replace"))
    assert "still in flight" in line and f"sky api cancel {request_id}" in line
    assert sum(waited) >= lease.LAUNCH_WAIT_S
    assert _statuses(fake_sky) == before and fake_sky._in_flight  # nothing launched or cancelled

    server_finishes_while_waiting(monkeypatch, fake_sky, None, 3 * lease.LAUNCH_POLL_S)
    replaced = _up_deadline(monkeypatch, script, tmp_path, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert len(fake_sky.live_jobs("llm-control")) == 1


def _statuses(fake_sky: FakeSky) -> dict[int, list[S]]:
    return {j: [t.status for t in fake_sky.job(j).tasks] for j in fake_sky.jobs}


def test_up_resume_beside_a_dead_controllers_live_training_job_is_refused(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 4: the controller's job ends FAILED_CONTROLLER while its training job trains;
    `up --deadline --resume` is refused in one line naming the job and `mncloud down llm`
    (before: a new controller overwrote the state and launched a second training job);
    `--replace` cancels the orphan first."""
    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(controller, S.RUNNING)
    Driver(_fresh_vm(monkeypatch, tmp_path, "controller-vm")).tick()
    (training,) = _named(fake_sky, "llm")
    fake_sky.set_status(training, S.RUNNING)
    fake_sky.set_status(controller, S.FAILED_CONTROLLER)

    line = _one_line(_up_deadline(monkeypatch, script, tmp_path, "--resume"))
    assert str(training) in line and "mncloud down llm" in line and "--replace" in line
    assert fake_sky.live_jobs() == [training]

    replaced = _up_deadline(monkeypatch, script, tmp_path, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert training not in fake_sky.live_jobs() and len(fake_sky.live_jobs("llm-control")) == 1


@pytest.mark.parametrize("lost", [1, 2])
def test_a_lost_answer_to_the_controllers_own_launch_is_not_a_failed_run(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lost: int,
) -> None:
    """`up --deadline`'s launch of llm-control goes through and its answer is lost (once:
    asked again, the job found; twice: unknown). Before: "failed: the controller was not
    launched" in the bucket's state, which the controller then started from (a final state:
    nothing to do, the run never trained), and `up --resume` refused beside that controller.
    Now: found, or one line saying it may run; the state never "failed"; a second `up` refused
    naming the controller."""
    from mncloud import control, layout

    fake_sky.lose("jobs.launch", lost)
    result = _up_deadline(monkeypatch, script, tmp_path)
    (controller,) = _named(fake_sky, "llm-control")
    bucket = control.load_uri(layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm"))
    assert bucket is not None and bucket.phase != "failed" and not bucket.final
    if lost == 1:
        assert result.exit_code == 0, result.output
        assert control.load_state("llm", fresh=False).controller_job_id == controller
    else:
        line = _one_line(result)
        assert "answer was lost" in line and "mncloud status llm" in line
    again = _one_line(_up_deadline(monkeypatch, script, tmp_path, "--resume"))
    assert str(controller) in again and fake_sky.live_jobs() == [controller]


def test_a_deadline_past_the_controllers_token_life_is_accepted_as_it_hands_off(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 5: where SkyPilot gives the controller its own token (service accounts), that
    token lives 3 days, unrenewed; the controller hands the run to a fresh controller job
    (a fresh token) before it expires (`handoff.py`), so `--deadline 100h` is accepted, its
    state saying the controller hands off (`test_control_handoff.py` follows one past 72 h),
    even where the laptop's own token (which SkyPilot's replaces) expires sooner."""
    from mncloud import control, layout
    from mncloud.control.access import TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, fake_sky.issue_token(fake_sky.user, days=1))
    fake_sky.health = {"external_proxy_auth_enabled": True, "service_account_token_enabled": True}
    up = _up_deadline(monkeypatch, script, tmp_path, "--deadline", "100h")
    assert up.exit_code == 0, up.output
    stored = control.load_uri(layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm"))
    assert stored is not None and stored.config.hands_off


def test_a_controller_reaching_the_server_by_password_does_not_hand_off(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint that carries a password: the controller's task asks for no token of
    SkyPilot's (`api_server_access: false`) and reaches the server by that password, which
    does not expire; so it plans no hand-off, even where the server has service accounts (a
    successor would get no fresh token either)."""
    from mncloud import control, layout

    fake_sky.health = {"service_account_token_enabled": True}
    endpoint = "https://ops:pw-7f3a91@sky.example.com"
    up = _up_deadline(monkeypatch, script, tmp_path, "--deadline", "100h", endpoint=endpoint)
    assert up.exit_code == 0, up.output
    stored = control.load_uri(layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm"))
    assert stored is not None and not stored.config.hands_off
    (job,) = fake_sky.live_jobs("llm-control")
    assert "api_server_access: false" in fake_sky.job(job).yaml, fake_sky.job(job).yaml


def test_the_token_life_is_skypilots() -> None:
    from sky.jobs import constants

    from mncloud.control.access import CONTROLLER_TOKEN_DAYS

    assert constants.MANAGED_JOB_TOKEN_TTL_DAYS == CONTROLLER_TOKEN_DAYS


def _group_backend(script: Path, monkeypatch: pytest.MonkeyPatch) -> object:  # noqa: F811
    from mncloud.render import jobgroup

    script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    return SkyPilotBackend()


@pytest.mark.parametrize("recovery", ["gang", "node"])
def test_a_lost_launch_answer_is_resolved_for_a_job_and_a_job_group_alike(
    recovery: str,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 3 (and one launch path): the answer to a job group's launch lost on the way,
    the group made: the launch resolves it from the server, as a plain job's (before: the
    group's launch recorded "launch failed" while the group ran)."""
    from tests.test_ledger_times import _launched

    if recovery == "node":
        _group_backend(script, monkeypatch)
    fake_sky.lose("jobs.launch")
    backend = _launched(script, fake_sky, tmp_path, spot=True, recovery=recovery)
    meta = load_meta("llm")
    assert meta is not None and meta.job_id == 7 and meta.error is None
    fake_sky.set_status(7, S.RUNNING)
    assert backend.status("llm").state is RunState.RUNNING


@pytest.mark.parametrize("recovery", ["gang", "node"])
def test_a_lost_answer_still_unknown_is_resolved_by_status_for_both(
    recovery: str,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 3: the server away while the launch is resolved: unknown, not failed; the next
    `status` finds the job (plain or group) once the server answers."""
    from tests.test_ledger_times import _launched

    if recovery == "node":
        _group_backend(script, monkeypatch)
    fake_sky.lose("jobs.launch", 2)  # the wait and the `sky.get` after it
    fake_sky.fail("api_status", sx.ApiServerConnectionError(fake_sky.server_url), 2)
    with pytest.raises(BackendError, match="answer was lost"):
        _launched(script, fake_sky, tmp_path, spot=True, recovery=recovery)
    meta = load_meta("llm")
    assert meta is not None and meta.error is None and meta.last_state is RunState.PENDING
    fake_sky.set_status(7, S.RUNNING)
    assert SkyPilotBackend().status("llm").state is RunState.RUNNING


def test_a_launch_the_server_failed_with_a_connection_error_is_not_a_lost_answer(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Point 6: the server ran the launch and failed it with a connection-type error (the
    cloud's API unreachable from it): a failed launch, SkyPilot's, not the user's; a
    `--max-restarts 0` deadline run launches again instead of ending as "an error in your
    code"."""
    from tests.test_control_faults import _looks

    fake_sky.fail("jobs.launch", ConnectionRefusedError("cloud API unreachable"))
    run = Driver(_state(script, tmp_path))
    _looks(run, 4)
    assert run.state.phase not in ("failed", "finished"), run.state.detail
    assert run.state.errors_retried == 0
    assert len(fake_sky.live_jobs("llm")) == 1


def test_a_plain_launch_the_server_failed_reads_as_skypilots_failure(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """Point 6, plain `up`: a failed launch (exit 2 at `up`), and `status` says SkyPilot's
    launch failed (INFRA), never the user's program."""
    from tests.test_ledger_times import _launched

    fake_sky.fail("jobs.launch", ConnectionRefusedError("cloud API unreachable"))
    with pytest.raises(BackendError, match="cloud API unreachable"):
        _launched(script, fake_sky, tmp_path, spot=True)
    status = SkyPilotBackend().status("llm")
    assert status.state is RunState.FAILED and status.failure is Failure.INFRA
    assert fake_sky.jobs == {}


def test_down_with_an_expired_login_says_so_in_one_line_and_cancels_nothing(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bad input: the laptop's token expired (the server answers 401): `down` says so in one
    line naming `sky api login`, cancels nothing and leaves the run as it was; after the
    login it stops the controller and its training job."""
    from typer.testing import CliRunner

    from mncloud.cli import app

    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(controller, S.RUNNING)
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
    expired = sx.ApiServerAuthenticationError(fake_sky.server_url)
    fake_sky.fail("jobs.queue_v2", expired, 3)
    result = CliRunner().invoke(app, ["down", "llm", "--now"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert "sky api login" in line and "nothing was done" in line
    assert fake_sky.live_jobs() == [controller]
    fake_sky._failing.clear()  # logged in again
    assert CliRunner().invoke(app, ["down", "llm", "--now"]).exit_code == 0
    assert fake_sky.live_jobs() == []
