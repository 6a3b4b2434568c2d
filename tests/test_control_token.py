"""A controller that outlives its SkyPilot API token does not run blind (issue #58, part 2).

SkyPilot 0.14.1 gives the controller's job a token of the launching user valid 3 days and
never renews it; past that every call is a 401. On `tests/fakesky/` (which issues that token
to the controller job and refuses it after its expiry on the test's clock, `tokens.py`): a late
run finishing on on-demand past its deadline is stopped at a checkpoint before the token
expires, and a controller started after the expiry makes no call at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sky.jobs import ManagedJobStatus as S

from mncloud import control
from mncloud.control.access import TOKEN_ENV, TOKEN_MARGIN_S, token_expiry
from tests.fakesky import FakeSky
from tests.test_control import FakeClock
from tests.test_control_cloud import Crash, Driver, _fresh_vm, _named, _status
from tests.test_control_faults import _looks, _up_deadline
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog

ACCOUNTS = {"service_account_token_enabled": True}
"""A server with service accounts: SkyPilot gives the controller's job its own token."""
HOUR = 3600.0


def _one_line(result: object) -> str:
    assert getattr(result, "exit_code", None) == 2 and "Traceback" not in result.output  # type: ignore[attr-defined]
    (line,) = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    return str(line)


def _late_run(
    script: Path,  # noqa: F811
    fake: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Driver, int, str]:
    """`up --deadline 70h --hours 60` from the laptop; the controller on its VM with the token
    SkyPilot gave its job; its training job launched and running. (driver, job, token)."""
    clock = FakeClock()
    fake.clock, fake.health = clock.time, dict(ACCOUNTS)
    up = _up_deadline(monkeypatch, script, tmp_path, "--deadline", "70h", "--hours", "60")
    assert up.exit_code == 0, up.output
    (controller,) = _named(fake, "llm-control")
    token = fake.job_tokens[controller]
    monkeypatch.setenv(TOKEN_ENV, token)  # what SkyPilot writes into the controller's secrets
    run = Driver(_fresh_vm(monkeypatch, tmp_path, "controller-vm"), clock)
    _looks(run, 1)
    (training,) = _named(fake, "llm")
    fake.set_status(training, S.RUNNING)
    _looks(run, 2)
    assert fake.live_jobs("llm") == [training] and not run.state.final
    return run, training, token


@pytest.mark.slow
def test_a_late_run_whose_successor_never_runs_is_stopped_at_a_checkpoint_before_expiry(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run misses its 70 h deadline and goes on on-demand ("finishing on on-demand"); the
    successor controller it launches to hand off to (`handoff.py`) never gets its VM. Up to
    72 h + 1 look on the fake clock: every SkyPilot call the controller makes is answered
    (none refused for an expired token); before the expiry it stops the run as `down` would
    (a notice, the training job cancelled) and cancels the successor, says why, and exits as
    done; after it, a look makes no call. The training job never runs with nobody steering it."""
    run, _first, token = _late_run(script, fake_sky, tmp_path, monkeypatch)
    expires = token_expiry({TOKEN_ENV: token})
    assert expires is not None and 71 * HOUR < expires - run.clock.now < 72 * HOUR

    while run.clock.now < expires - TOKEN_MARGIN_S - 2 * HOUR:
        run.clock.now += 2 * HOUR
        _looks(run, 3, gap=1)
        for job in fake_sky.live_jobs("llm"):
            fake_sky.set_status(job, S.RUNNING)
        assert not run.state.final, run.state.detail
    assert any(d.reason.startswith("past the deadline") for d in run.state.decisions)
    (training,) = fake_sky.live_jobs("llm")  # late, on on-demand
    assert run.state.market.value == "on-demand"

    calls = len(fake_sky.calls)
    while not run.state.final and run.clock.now <= expires + 60:
        _looks(run, 1, gap=60)
    assert run.clock.now < expires, "stopped only at the expiry"
    assert run.state.phase == "stopped", run.state.detail
    assert "API token expires" in run.state.detail and "--resume" in run.state.detail
    assert "had not started by the stop point" in run.state.detail
    assert _status(fake_sky, training) == "CANCELLED" and not fake_sky.live_jobs("llm")
    (controller, successor) = _named(fake_sky, "llm-control")
    assert _status(fake_sky, successor) == "CANCELLED"
    assert len(fake_sky.calls) > calls  # the stop was made through SkyPilot, token valid

    run.clock.now = expires + 1  # 72 h + 1 look
    calls = len(fake_sky.calls)
    run.ctl.look()
    assert len(fake_sky.calls) == calls and fake_sky.refused == []
    stored = control.load_uri(run.state.config.state_uri or "")
    assert stored is not None and stored.phase == "stopped"

    # As the detail says: `--resume` goes on under a new controller job with a new token.
    fake_sky.set_status(controller, S.SUCCEEDED)  # it exited 0: done
    monkeypatch.delenv(TOKEN_ENV)
    again = _up_deadline(monkeypatch, script, tmp_path, "--deadline", "70h", "--hours", "60",
                         "--resume")  # fmt: skip
    assert again.exit_code == 0, again.output
    (new,) = fake_sky.live_jobs("llm-control")
    renewed = token_expiry({TOKEN_ENV: fake_sky.job_tokens[new]})
    assert renewed is not None and renewed - run.clock.now == pytest.approx(72 * HOUR, abs=1)


@pytest.mark.slow
def test_a_controller_restarted_past_its_token_makes_no_call_and_says_what_runs(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SkyPilot restarts a controller (a lost VM) after its token expired: it starts with the
    same dead token, and a take-down its crash left half done. It makes no SkyPilot call
    (each would be a 401), not even to finish that take-down; it ends as done (no restart
    loop), its state naming the training job that may still run and `mncloud down`, which
    from the laptop (its own login) then cancels it."""
    from mncloud.cli import app
    from tests.test_control_cloud import runner

    run, training, token = _late_run(script, fake_sky, tmp_path, monkeypatch)
    expires = token_expiry({TOKEN_ENV: token})
    assert expires is not None

    def crash(_notice_s: float) -> None:
        raise Crash

    monkeypatch.setattr(run.ctl, "down", crash)  # the VM is lost mid-switch: `closing` kept
    with pytest.raises(Crash):
        run.ctl.take_down("switching to on-demand")
    run.clock.now = expires + 1
    calls = len(fake_sky.calls)
    restarted = Driver(_fresh_vm(monkeypatch, tmp_path, "vm2"), run.clock)
    final = restarted.ctl.run()
    assert len(fake_sky.calls) == calls and fake_sky.refused == []
    assert final.phase == "failed" and f"mncloud down {final.name}" in final.detail
    assert "token expired" in final.detail and fake_sky.live_jobs("llm") == [training]

    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
    down = runner.invoke(app, ["down", "llm", "--now"])
    assert down.exit_code == 0, down.output
    assert _status(fake_sky, training) == "CANCELLED"


@pytest.mark.slow
def test_a_controller_that_stalled_past_its_token_makes_no_call_at_its_next_look(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller's last look came before its stop point and the next one after the expiry
    (its VM stalled): that look makes no SkyPilot call (each would be a 401), ends the
    controller as done, and its state names the training job that may still run."""
    run, training, token = _late_run(script, fake_sky, tmp_path, monkeypatch)
    expires = token_expiry({TOKEN_ENV: token})
    assert expires is not None
    run.clock.now = expires + 1
    calls = len(fake_sky.calls)
    run.ctl.look()
    assert len(fake_sky.calls) == calls and fake_sky.refused == []
    assert run.state.phase == "failed" and "mncloud down llm" in run.state.detail
    assert fake_sky.live_jobs("llm") == [training]


def test_the_fake_refuses_an_expired_token_as_skypilot_does(
    fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake's 401: a token it issued, from its expiry second on (PyJWT's `exp` check),
    raises SkyPilot's `ApiServerAuthenticationError`; before that, the call is answered."""
    import sky
    from sky import exceptions as sx

    clock = FakeClock()
    fake_sky.clock = clock.time
    token = fake_sky.issue_token(fake_sky.user, days=3)
    expires = token_expiry({TOKEN_ENV: token})
    assert expires is not None and expires == int(clock.now) + 3 * 86400
    monkeypatch.setenv(TOKEN_ENV, token)
    fake_sky.add_job("x")
    clock.now = expires - 1
    sky.get(sky.jobs.queue_v2(refresh=False))
    clock.now = expires
    with pytest.raises(sx.ApiServerAuthenticationError):
        sky.jobs.queue_v2(refresh=False)
    assert fake_sky.refused == ["jobs.queue_v2"]


def test_a_deadline_past_the_laptops_own_token_is_refused_at_up(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server too old to give the controller a token of its own: the controller carries the
    laptop's, and stops an hour before it expires. A deadline past that: one line naming the
    token and the bound, exit 2, nothing launched; one within it is accepted."""
    from sky.server import constants as server_constants

    old = int(server_constants.MIN_API_ACCESS_API_VERSION) - 1
    fake_sky.health = {"api_version": str(old)}
    monkeypatch.setenv(TOKEN_ENV, fake_sky.issue_token(fake_sky.user, days=1))
    line = _one_line(_up_deadline(monkeypatch, script, tmp_path, "--deadline", "30h"))
    assert TOKEN_ENV in line and "expires in 24 h" in line and "--deadline 22h" in line
    assert "a fresh controller would carry the same one" in line
    assert fake_sky.jobs == {}
    assert _up_deadline(monkeypatch, script, tmp_path, "--deadline", "20h").exit_code == 0
    stored = control.load_uri(layout_uri(tmp_path))
    assert stored is not None and not stored.config.hands_off  # its successor: the same token


def layout_uri(tmp_path: Path) -> str:
    """Run llm's controller state in the test's bucket."""
    from mncloud import layout

    return layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm")
