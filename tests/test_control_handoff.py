"""The controller hands the run to a fresh controller job before its token expires (#58).

On `tests/fakesky/` (which gives each controller job launched with `api_server_access` a fresh
3-day token of its user and answers an expired one with a 401 on the test's clock,
`tokens.py`), each controller job is a `VM`: its own home, the token SkyPilot gave its job,
its hand-off key; the test plays SkyPilot's part (a job's VM comes up: RUNNING; a process
that exits 0: SUCCEEDED) and checks, at every look, who steers and what trains.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sky.jobs import ManagedJobStatus as S

from mncloud.backends.skypilot.meta import load_meta
from mncloud.control.access import TOKEN_ENV, TOKEN_MARGIN_S, token_expiry
from mncloud.control.handoff import HANDOFF_ENV, HANDOFF_MARGIN_S
from mncloud.records.store import list_records
from tests.fakesky import FakeSky
from tests.test_control import FakeClock
from tests.test_control_cloud import Driver, _fresh_vm, _named, _status
from tests.test_control_faults import _up_deadline
from tests.test_control_token import ACCOUNTS, HOUR
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog


class VM:
    """One controller job on its own VM: its home, the token SkyPilot gave its job, its key."""

    def __init__(
        self, fake: FakeSky, job_id: int, clock: FakeClock, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:  # fmt: skip
        self.fake, self.job_id, self.clock = fake, job_id, clock
        docs = [d for d in yaml.safe_load_all(fake.job(job_id).yaml) if d and "envs" in d]
        envs = docs[0]["envs"] if docs else {}
        self.key = str(envs.get(HANDOFF_ENV, ""))
        self.token = fake.job_tokens[job_id]
        self.expires = token_expiry({TOKEN_ENV: self.token})
        self.env = {TOKEN_ENV: self.token, HANDOFF_ENV: self.key,
                    "MNCLOUD_HOME": str(tmp_path / f"vm-{job_id}")}  # fmt: skip
        for name in self.env:  # restored after the test
            monkeypatch.setenv(name, os.environ.get(name, ""))
        with self.on():
            self.run = Driver(_fresh_vm(monkeypatch, tmp_path, f"vm-{job_id}"), clock)

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        """This VM's process environment while it runs."""
        os.environ.update(self.env)
        yield

    def look(self) -> None:
        """One look; never with an expired token."""
        assert self.expires is not None and self.clock.now < self.expires
        with self.on():
            self.run.ctl.look()


def _successor(fake: FakeSky, holder: VM) -> int | None:
    """The holder's successor job once launched (and not given up on)."""
    nxt = holder.run.state.successor
    if nxt is None or nxt.key == holder.run.state.controller_key or nxt.failed:
        return None
    return nxt.job_id


def _trains(fake: FakeSky) -> int:
    """The one live training job (its VMs up: RUNNING)."""
    (training,) = fake.live_jobs("llm")
    fake.set_status(training, S.RUNNING)
    return training


def _long_run(
    script: Path,  # noqa: F811
    fake: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> VM:
    """`up --deadline 100h --hours 90` on a fake clock, its controller's VM after one look."""
    clock = FakeClock()
    fake.clock, fake.health = clock.time, dict(ACCOUNTS)
    up = _up_deadline(monkeypatch, script, tmp_path, "--deadline", "100h", "--hours", "90")
    assert up.exit_code == 0, up.output
    (first,) = _named(fake, "llm-control")
    holder = VM(fake, first, clock, tmp_path, monkeypatch)
    holder.look()
    return holder


@pytest.mark.slow
def test_the_controller_hands_off_before_its_token_expires_and_the_run_goes_on(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up --deadline 100h --hours 90`, a late run finishing on on-demand past 100 h. Before
    its token's stop point the controller launches a successor (a fresh token); once that runs
    the old one hands it the run and exits 0 (SUCCEEDED); the successor adopts the training
    job (never cancelled) and steers past 72 h + 1 look, and hands off again before 144 h.
    Exactly one training job is live at every look and one controller holds the run; no
    SkyPilot call is made with an expired token."""
    holder = _long_run(script, fake_sky, tmp_path, monkeypatch)
    clock = holder.clock
    training, start, handed, cost = _trains(fake_sky), clock.now, [], 0.0
    waiting: VM | None = None
    while clock.now < start + 140 * HOUR:
        clock.now += HOUR
        training = _trains(fake_sky)
        if waiting is not None:  # the successor looks: still the old holder's run
            decisions, calls = len(holder.run.state.decisions), len(fake_sky.calls)
            waiting.look()
            assert not waiting.run.ctl.succeeded and waiting.run.state.controller_key == holder.key
            launches = [c for c in fake_sky.calls[calls:] if c[0] in ("jobs.launch", "jobs.cancel")]
            assert launches == [] and len(waiting.run.state.decisions) == decisions
            cancels = len(fake_sky.called("jobs.cancel"))
            with holder.on():
                holder.run.ctl.run()  # the hand-off: `mncloud control` returns, exit 0
            assert holder.run.ctl.succeeded and not holder.run.state.final
            assert len(fake_sky.called("jobs.cancel")) == cancels
            fake_sky.set_status(holder.job_id, S.SUCCEEDED)  # SkyPilot: its process exited 0
            waiting.look()  # the run is its own: it adopts the training job and steers
            assert fake_sky.live_jobs("llm") == [training], "adopted, not cancelled"
            assert waiting.run.state.controller_job_id == waiting.job_id
            live = waiting.run.state.live
            with waiting.on():  # its fresh VM has the launch's records back: billed on
                assert live is not None and load_meta("llm") is not None
                assert live.run_id in {r.run_id for r in list_records("llm")}
            cost = waiting.run.state.cost
            handed.append((clock.now - start, holder, waiting))
            holder, waiting = waiting, None
            continue
        holder.look()
        assert not holder.run.state.final, holder.run.state.detail
        assert len(fake_sky.live_jobs("llm")) == 1
        assert [holder.job_id] == [
            j for j in fake_sky.live_jobs("llm-control") if j != _successor(fake_sky, holder)
        ]
        nxt = _successor(fake_sky, holder)
        if nxt is not None:
            assert holder.token not in fake_sky.job(nxt).yaml  # a secret, and SkyPilot's anew
            fake_sky.set_status(nxt, S.RUNNING)  # its VM came up
            waiting = VM(fake_sky, nxt, clock, tmp_path, monkeypatch)

    assert [round(h / HOUR) for h, _old, _new in handed] == [66, 131]
    for at, old, new in handed:
        assert old.expires is not None and new.expires is not None
        assert at + start < old.expires - TOKEN_MARGIN_S  # before the old one's stop point
        assert at + start > old.expires - TOKEN_MARGIN_S - HANDOFF_MARGIN_S - HOUR
        assert new.expires == pytest.approx(at + start - HOUR + 72 * HOUR, abs=2)
        assert _status(fake_sky, old.job_id) == "SUCCEEDED"
    assert clock.now > handed[0][1].expires + HOUR  # past the first token + 1 look: steered
    assert any(d.reason.startswith("past the deadline") for d in holder.run.state.decisions)
    assert holder.run.state.market.value == "on-demand"
    assert fake_sky.refused == []
    assert "handed off at h 131" in holder.run.state.controller
    assert holder.run.state.cost > cost  # the last successor's ledger goes on

    from mncloud.cli import app
    from tests.test_control_cloud import runner

    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))  # `status` from the laptop
    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.delenv(HANDOFF_ENV)
    shown = runner.invoke(app, ["status", "llm"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.output.split())
    assert f"job {handed[1][2].job_id} (llm-control); the controller handed off at h 131" in words


@pytest.mark.slow
def test_a_failed_successor_launch_falls_back_to_the_stop(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every launch of a successor fails (the API server refuses it): tried again each
    hour, then at the stop point the run is stopped at a checkpoint as before, the reason
    naming the failed hand-off; no SkyPilot call with an expired token, nothing left live."""
    from mncloud.errors import BackendError

    holder = _long_run(script, fake_sky, tmp_path, monkeypatch)
    clock, first = holder.clock, holder.job_id
    assert holder.expires is not None
    while clock.now < holder.expires - TOKEN_MARGIN_S - HANDOFF_MARGIN_S - HOUR:
        clock.now += HOUR
        _trains(fake_sky)
        holder.look()
    fake_sky.fail("jobs.launch", BackendError("the API server refused the launch"), times=20)
    while not holder.run.state.final:
        clock.now += HOUR / 2
        holder.look()
    assert clock.now < holder.expires
    assert holder.run.state.phase == "stopped"
    detail = holder.run.state.detail
    assert "hand-off to a fresh controller job failed" in detail and "--resume" in detail
    assert fake_sky.live_jobs("llm") == [] and fake_sky.live_jobs("llm-control") == [first]
    assert len(fake_sky.called("jobs.launch")) >= 2  # the successor's launch tried again
    assert fake_sky.refused == []


class Crash(Exception):
    """The controller's VM is lost mid-action."""


def _successor_runs(
    script: Path,  # noqa: F811
    fake: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    running: bool = True,
) -> tuple[VM, VM, int]:
    """`up --deadline 100h --hours 90`, steered hourly until the controller launched its
    successor, whose VM comes up (`running`): (holder, successor, the live training job)."""
    holder = _long_run(script, fake, tmp_path, monkeypatch)
    clock = holder.clock
    while _successor(fake, holder) is None:
        clock.now += HOUR
        _trains(fake)
        holder.look()
    nxt = _successor(fake, holder)
    assert nxt is not None
    if running:
        fake.set_status(nxt, S.RUNNING)
    return holder, VM(fake, nxt, clock, tmp_path, monkeypatch), _trains(fake)


@pytest.mark.slow
def test_a_hand_off_waits_for_a_training_launch_in_flight(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SkyPilot fails the training job; the controller's relaunch is cut short (its VM lost
    mid-call: `launching` journaled). Its successor runs, but the next look finishes the
    launch first; the run is handed only at the look after, and the successor adopts that
    launch: one training job."""
    holder, successor, training = _successor_runs(
        script, fake_sky, tmp_path, monkeypatch, running=False
    )
    ctl = holder.run.ctl
    _dies_mid_relaunch(holder, fake_sky, training, monkeypatch)
    fake_sky.set_status(successor.job_id, S.RUNNING)
    holder.clock.now += 60
    holder.look()
    assert holder.run.state.controller_key == "" and not ctl.succeeded  # not handed yet
    assert holder.run.state.launching is None
    (relaunched,) = fake_sky.live_jobs("llm")
    holder.clock.now += 60
    holder.look()
    assert holder.run.state.controller_key == successor.key and ctl.succeeded
    successor.clock.now += 60
    successor.look()
    assert fake_sky.live_jobs("llm") == [relaunched]
    assert successor.run.state.live is not None
    assert relaunched in successor.run.state.live.job_ids


def _dies_mid_relaunch(
    holder: VM, fake_sky: FakeSky, training: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training job fails and the holder's look dies inside its relaunch's call (the
    launch journaled, its answer never had): its launcher is whole again after."""
    ctl = holder.run.ctl
    launcher = ctl.launcher

    def crash(*_args: object, **_kw: object) -> None:
        raise Crash

    fake_sky.set_status(training, S.FAILED_CONTROLLER)
    monkeypatch.setattr(ctl, "launcher", crash)
    with pytest.raises(Crash):
        holder.look()
    assert holder.run.state.launching is not None
    monkeypatch.setattr(ctl, "launcher", launcher)


@pytest.mark.slow
def test_a_stop_point_reached_mid_launch_still_cancels_the_pending_successor(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The successor never gets its VM, and at the holder's stop point a relaunch of the
    training job is journaled (its VM lost mid-call): the look finishes that launch and stops
    the run at a checkpoint, and the successor still pending is cancelled all the same, so no
    `llm-control` outlives the stop (an `up --resume` would be refused beside it)."""
    holder, successor, training = _successor_runs(
        script, fake_sky, tmp_path, monkeypatch, running=False
    )
    clock = holder.clock
    assert holder.expires is not None
    clock.now = holder.expires - TOKEN_MARGIN_S - 60
    _dies_mid_relaunch(holder, fake_sky, training, monkeypatch)
    for _ in range(10):  # from the stop point on, until the stop is done
        clock.now += 120
        holder.look()
        if holder.run.state.final:
            break
    assert clock.now < holder.expires and holder.run.state.phase == "stopped"
    assert _status(fake_sky, successor.job_id) == "CANCELLED"
    assert fake_sky.live_jobs("llm-control") == [holder.job_id]
    assert fake_sky.live_jobs("llm") == [] and fake_sky.refused == []


@pytest.mark.slow
def test_a_successor_takes_the_run_from_a_holder_that_died(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The holder's job fails past its restarts before it hands off: the successor, waiting,
    sees its job over and takes the run, adopting the training job (never cancelled)."""
    holder, successor, training = _successor_runs(script, fake_sky, tmp_path, monkeypatch)
    successor.look()
    assert successor.run.state.controller_key == ""  # still the holder's: it waits
    fake_sky.set_status(holder.job_id, S.FAILED)
    successor.clock.now += 60
    successor.look()
    assert successor.run.state.controller_key == successor.key
    assert successor.run.state.controller_job_id == successor.job_id
    successor.clock.now += 300
    successor.look()
    assert fake_sky.live_jobs("llm") == [training] and _status(fake_sky, training) == "RUNNING"


@pytest.mark.slow
def test_the_old_controller_restarted_after_the_hand_off_touches_nothing(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the hand-off, SkyPilot restarts the old controller (a crash before its exit):
    with the state naming another key it makes no SkyPilot call, saves nothing, and ends
    (exit 0), leaving the successor the only one steering."""
    from mncloud import control

    holder, successor, training = _successor_runs(script, fake_sky, tmp_path, monkeypatch)
    holder.look()
    successor.look()
    assert successor.run.state.controller_key == successor.key
    uri = successor.run.state.config.state_uri or ""
    with holder.on():
        restarted = Driver(_fresh_vm(monkeypatch, tmp_path, "vm-restarted"), holder.clock)
        before, calls = control.load_uri(uri), len(fake_sky.calls)
        restarted.ctl.run()
    assert restarted.ctl.succeeded and len(fake_sky.calls) == calls
    after = control.load_uri(uri)
    assert before is not None and after is not None and after.updated_at == before.updated_at
    assert fake_sky.live_jobs("llm") == [training]
