"""The lease waits for the last controller's launches in flight (issue #58, first part).

The deadline controller dies while its training launch is still in flight at the API server
(`tests/fakesky/`: a held `jobs.launch`, which the "server" finishes while the new `up`
waits); `up --deadline --resume`, or `--replace` while the old controller's job lives, must
end with exactly one live training job: the old launch's job cancelled before the new
controller starts, its run id kept in the new state, the ledger billing what each job ran.
One that stays in flight past `lease.LAUNCH_WAIT_S` refuses the `up`: one line, exit 2,
nothing launched. Every wait is on the test's fake clock (`lease.pause`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sky.jobs import ManagedJobStatus as S

from mncloud import control, layout
from mncloud.control import lease
from mncloud.records.ledger import cost_summary
from mncloud.records.store import fetch_record, list_records
from tests.fakesky import FakeSky
from tests.test_control import GAP, FakeClock
from tests.test_control_cloud import Crash, Driver, _fresh_vm, _named, runner
from tests.test_control_faults import _up_deadline
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog

#: When the "server" finishes the dead controller's launch, in seconds of the new `up`'s wait.
FINISHED_AFTER_S = 3 * lease.LAUNCH_POLL_S


def _dies_launching(
    fake_sky: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
    script: Path,  # noqa: F811
    tmp_path: Path,
) -> tuple[int, Driver, str]:
    """`up --deadline` from the laptop; its controller (job N, on its own VM) journals its
    first training launch, sends it and dies before the answer: the request stays in flight.
    (controller job id, the dead controller's driver, the journaled run id)."""
    import sky

    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(controller, S.RUNNING)
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm")

    def sent_then_killed(*args: Any, **kw: Any) -> Any:
        from mncloud.launch import launch

        with monkeypatch.context() as patch:
            patch.setattr(sky, "stream_and_get", lambda *_a, **_k: (_ for _ in ()).throw(Crash))
            launch(*args, **kw)

    fake_sky.held.add("jobs.launch")
    dead = Driver(state, launcher=sent_then_killed)
    with pytest.raises(Crash):
        dead.tick()
    fake_sky.held.clear()  # the server goes on with the request it holds; later ones answer
    assert _named(fake_sky, "llm") == [] and len(fake_sky._in_flight) == 1
    journal = control.load_uri(_state_uri(tmp_path))
    assert journal is not None and journal.launching is not None
    assert journal.launching.run_id is not None
    return controller, dead, journal.launching.run_id


def _steering(
    fake_sky: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
    script: Path,  # noqa: F811
    tmp_path: Path,
) -> tuple[int, Driver, int]:
    """`up --deadline` from the laptop; its controller (on its own VM) launches a training
    job, which gets its VMs and trains, seen so by a look. (controller job id, the
    controller's driver, the training job id)."""
    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(controller, S.RUNNING)
    run = Driver(_fresh_vm(monkeypatch, tmp_path, "controller-vm"))
    run.tick()
    (training,) = _named(fake_sky, "llm")
    fake_sky.set_status(training, S.RUNNING)
    run.tick(1, gap=GAP)
    return controller, run, training


def _state_uri(tmp_path: Path) -> str:
    return layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm")


def server_finishes_while_waiting(
    monkeypatch: pytest.MonkeyPatch,
    fake_sky: FakeSky,
    clock: FakeClock | None,
    after_s: float | None,
) -> list[float]:
    """`lease.pause` on a fake clock (None: no clock moves); the server finishes the requests
    in flight once `after_s` of the wait passed (None: never). The pauses, in seconds."""
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if clock is not None:
            clock.now += seconds
        if after_s is not None and sum(pauses) >= after_s:
            fake_sky.finish_in_flight()

    monkeypatch.setattr(lease, "pause", pause)
    return pauses


@pytest.mark.parametrize("flag", ["--resume", "--replace"])
def test_a_launch_in_flight_when_the_controller_died_ends_in_one_training_job(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
) -> None:
    """`--resume` after the controller job FAILED past its restarts; `--replace` while it is
    still live. Before: the new controller started at once, the server then finished the old
    request, and training jobs [old, new] lived together, the new state blind to the old run
    id. Now: the `up` waits for that request (the server finishes it meanwhile), cancels the
    job it made, keeps its run id; the new controller's launch is the one live job."""
    controller, dead, old_run_id = _dies_launching(fake_sky, monkeypatch, script, tmp_path)
    if flag == "--resume":
        fake_sky.set_status(controller, S.FAILED_CONTROLLER)
    pauses = server_finishes_while_waiting(monkeypatch, fake_sky, dead.clock, FINISHED_AFTER_S)

    result = _up_deadline(monkeypatch, script, tmp_path, flag)
    assert result.exit_code == 0, result.output
    fake_sky.finish_in_flight()  # whatever the server still held, it finishes now
    assert controller not in fake_sky.live_jobs() and len(fake_sky.live_jobs("llm-control")) == 1
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm-2")
    new = Driver(state, dead.clock)
    new.tick()
    old_job, new_job = _named(fake_sky, "llm")
    assert fake_sky.live_jobs("llm") == [new_job]  # one training job: the new controller's
    assert fake_sky.job(old_job).tasks[0].status is S.CANCELLED
    assert fake_sky.running_seconds(old_job) == [0.0]  # made, never ran: nothing to bill
    assert old_run_id in state.earlier_run_ids
    assert sum(pauses) == FINISHED_AFTER_S  # it waited, on the clock, until the server ended it

    fake_sky.set_status(new_job, S.RUNNING)
    new.tick(3)
    assert fake_sky.live_jobs("llm") == [new_job]
    (record,) = list_records("llm")  # the new controller's home: its own launch only
    ran_s = fake_sky.running_seconds(new_job)[0]
    price = next(e.hourly_price for e in record.events if e.kind == "launch")
    assert ran_s > 0 and price is not None and price > 0
    assert cost_summary(record, now=new.clock.now).total == pytest.approx(price * ran_s / 3600)
    old = fetch_record(f"file://{tmp_path / 'bucket'}/llm", old_run_id)
    assert old is None or cost_summary(old, now=new.clock.now).total == 0.0


def test_resume_with_the_launch_still_in_flight_past_the_wait_is_refused_nothing_launched(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bad input: the dead controller's launch is still in flight after `LAUNCH_WAIT_S`: one
    line naming the request and how to mend it, exit 2; nothing launched or cancelled, the
    old state in the bucket as it was. Once the server ends it, `--resume` goes on."""
    controller, dead, _run_id = _dies_launching(fake_sky, monkeypatch, script, tmp_path)
    fake_sky.set_status(controller, S.FAILED_CONTROLLER)
    pauses = server_finishes_while_waiting(monkeypatch, fake_sky, dead.clock, None)
    launches = len(fake_sky.called("jobs.launch"))
    before = control.load_uri(_state_uri(tmp_path))

    result = _up_deadline(monkeypatch, script, tmp_path, "--resume")
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    (request_id,) = fake_sky._in_flight
    assert "still in flight" in line and request_id in line and "nothing was launched" in line
    assert f"sky api cancel {request_id}" in line
    assert sum(pauses) >= lease.LAUNCH_WAIT_S  # the bound, on the fake clock
    assert len(fake_sky.called("jobs.launch")) == launches and fake_sky.live_jobs() == []
    assert control.load_uri(_state_uri(tmp_path)) == before

    fake_sky.finish_in_flight()
    again = _up_deadline(monkeypatch, script, tmp_path, "--resume")
    assert again.exit_code == 0, again.output
    (old_job,) = _named(fake_sky, "llm")
    assert old_job not in fake_sky.live_jobs() and len(fake_sky.live_jobs("llm-control")) == 1


def test_resume_beside_a_job_the_dead_controller_steered_is_still_refused(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--resume` cancels only a launch the dead controller journaled and never recorded;
    one it recorded (and steered, training since) stays the user's to stop with its notice:
    refused in one line, as before, and kept live."""
    controller, _run, training = _steering(fake_sky, monkeypatch, script, tmp_path)
    fake_sky.set_status(controller, S.FAILED_CONTROLLER)

    result = _up_deadline(monkeypatch, script, tmp_path, "--resume")
    assert result.exit_code == 2, result.output
    assert str(training) in result.stderr and "mncloud down llm" in result.stderr
    assert fake_sky.live_jobs() == [training]


@pytest.mark.parametrize("then", ["controller", "down"])
def test_a_launch_up_could_not_see_is_cancelled_by_the_new_controller_before_it_launches(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    then: str,
) -> None:
    """The dead controller was another API user, and the server shows the laptop other users'
    request bodies as null (auth on): `up --resume` cannot tell the launch in flight is the
    run's and goes on. The new controller (the controller's identity, which sees its own
    requests) knows the old run id from its state: before it launches, it waits for that
    request and cancels the job it made. One live training job. (Or `down` first: it finds
    that job by the old run id the new state keeps.)"""
    import sky

    from mncloud.cli import app
    from tests.fakesky import LAPTOP, User
    from tests.fakesky.wire import caller

    controller_vm = User("controller-vm", "c0417001")
    fake_sky.as_user(controller_vm)
    controller, dead, old_run_id = _dies_launching(fake_sky, monkeypatch, script, tmp_path)
    fake_sky.set_status(controller, S.FAILED_CONTROLLER)
    fake_sky.as_user(LAPTOP)
    seen = sky.api_status

    def scoped(*args: Any, **kwargs: Any) -> list[Any]:
        rows = seen(*args, **kwargs)
        me = caller(LAPTOP).user_hash
        return [r if r.user_id == me else r.model_copy(update={"request_body": None})
                for r in rows]  # fmt: skip

    with monkeypatch.context() as patch:
        patch.setattr(sky, "api_status", scoped)
        result = _up_deadline(monkeypatch, script, tmp_path, "--resume")
    assert result.exit_code == 0, result.output
    fake_sky.finish_in_flight()  # the server makes the old launch's job after `up` looked
    (old_job,) = _named(fake_sky, "llm")
    assert fake_sky.live_jobs("llm") == [old_job]
    if then == "down":
        assert runner.invoke(app, ["down", "llm", "--now"]).exit_code == 0
        assert fake_sky.live_jobs() == []
        return

    fake_sky.as_user(controller_vm)
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm-2")
    assert old_run_id in state.earlier_run_ids
    new = Driver(state, dead.clock)
    new.ctl._recover()
    new.tick()
    old_again, new_job = _named(fake_sky, "llm")
    assert old_again == old_job and fake_sky.live_jobs("llm") == [new_job]


def test_the_next_controller_ends_the_record_of_a_job_the_dead_one_left_open(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller dies while the job it steers trains; that job then ends (cancelled
    outside mncloud) with no look of a controller after it: its record, in the bucket, bills
    on to whenever it is read. The controller `up --resume` starts closes it at SkyPilot's
    end of the job (`billing.close_earlier`): the bucket's copy bills what the job ran, and
    stays so however late it is read."""
    controller, dead, training = _steering(fake_sky, monkeypatch, script, tmp_path)
    (run_id,) = dead.state.run_ids
    dead.clock.now += 600.0  # it trains on; the controller's job dies before its next look
    fake_sky.set_status(controller, S.FAILED_CONTROLLER)
    fake_sky.set_status(training, S.CANCELLED)  # `sky jobs cancel`: nobody looks after it
    dead.clock.now += 1200.0
    bucket = f"file://{tmp_path / 'bucket'}/llm"
    left = fetch_record(bucket, run_id)
    assert left is not None and not left.finished  # open: it bills on

    assert _up_deadline(monkeypatch, script, tmp_path, "--resume").exit_code == 0
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm-2")
    assert run_id in state.earlier_run_ids
    new = Driver(state, dead.clock)
    new.ctl._recover()
    new.tick()
    closed = fetch_record(bucket, run_id)
    assert closed is not None and closed.finished
    price = next(e.hourly_price for e in closed.events if e.kind == "launch")
    (ran_s,) = fake_sky.running_seconds(training)
    assert ran_s > 600.0 and price is not None
    late = new.clock.now + 24 * 3600
    assert cost_summary(closed, now=late).total == pytest.approx(price * ran_s / 3600)
