"""The deadline controller on SkyPilot, offline: restarted anywhere it never launches twice,
every way a launch ends has its answer, and `down` leaves nothing of the run live.

SkyPilot's SDK is `tests/fakesky.py` (`fake_sky`: every call bound to the real signature, the
client's own DAG conversion, a managed-jobs table whose states the test scripts). Everything
else is real: plan, render, launch, run records in a file:// bucket, the controller on a fake
clock, and a "fresh VM" is a fresh MNCLOUD_HOME with the state read from the bucket.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from sky.jobs import ManagedJobStatus as S
from typer.testing import CliRunner

from mncloud import control, layout
from mncloud.backends.skypilot.meta import load_meta
from mncloud.control.loop import Controller
from mncloud.control.markets import ManagedJobMarket
from mncloud.control.outcomes import MAX_RELAUNCHES, VANISHED_LOOKS
from mncloud.control.recovery import LaunchUnknown
from mncloud.deadline.policy import Mode
from mncloud.records.ledger import cost_summary
from mncloud.records.store import list_records
from mncloud.request import build_spec
from mncloud.spec.launch import LaunchOptions
from tests.fakesky import ERROR, LAPTOP, FakeSky, User
from tests.test_control import GAP, FakeClock
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
runner = CliRunner()


class Crash(BaseException):
    """The controller dies here (a kill: nothing catches it)."""


def _named(fake: FakeSky, name: str) -> list[int]:
    return [job.job_id for job in fake.jobs.values() if job.name == name]


def _status(fake: FakeSky, job_id: int) -> str:
    (task,) = fake.job(job_id).tasks
    return task.status.value


def _launches(fake: FakeSky) -> list[Any]:
    return [*fake.called("jobs.launch"), *fake.called("launch")]


def _other_run(fake: FakeSky, name: str) -> int:
    """A live job of the same name, of another run (another run id in its envs)."""
    job_id = fake.add_job(name, S.RUNNING)
    fake.job(
        job_id
    ).yaml = f"name: {name}\nenvs:\n  MNCLOUD_RUN_ID: {name}-19990101T000000-abcdef\n"
    return job_id


# ------------------------------------------------------------------------------ helpers


def _state(script: Path, tmp_path: Path, **flags: Any) -> control.ControlState:  # noqa: F811
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(script, gpus="H100:8", nodes=4, name="llm", bucket=bucket, **flags)
    state = control.deadline_state(
        spec, LaunchOptions(hours=2, recovery_minutes=10), deadline_s=4 * 3600,
        hours_given=True, spot_price=10.0, on_demand_price=30.0, policy="uniform-progress",
    )  # fmt: skip
    control.save_state(state)
    return state


class Driver:
    """A controller on a fake clock, one look per `tick`."""

    def __init__(self, state: control.ControlState, clock: FakeClock | None = None,
                 **kw: Any) -> None:  # fmt: skip
        from tests.fakesky import server

        self.clock = clock or FakeClock()
        if server.INSTALLED is not None:  # the fake server's job times on the same clock
            server.INSTALLED.clock = self.clock.time
        self.ctl = Controller(state, ManagedJobMarket(), clock=self.clock, **kw)
        self.state = state
        if state.started_at is None:
            state.started_at = self.clock.now

    def tick(self, n: int = 1, *, gap: float = GAP) -> None:
        """`n` looks `gap` seconds apart, as `Controller.run` makes them, until the run ends."""
        for _ in range(n):
            if self.state.final:
                return
            self.ctl.step()
            control.save_state(self.state)
            self.clock.now += gap


def _fresh_vm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> control.ControlState:
    """A new VM for the controller: an empty MNCLOUD_HOME, the state from the bucket."""
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / name))
    assert list_records("llm") == [] and load_meta("llm") is None
    uri = layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm")
    state = control.load_uri(uri)
    assert state is not None
    control.save_state(state)
    return state


# ------------------------------------------------------------------- restarted anywhere


@pytest.mark.slow
def test_a_controller_restarted_with_a_fresh_home_refinds_job_n_and_launches_nothing(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = Driver(_state(script, tmp_path))
    first.tick()
    (job,) = _named(fake_sky, "llm")
    assert first.state.live is not None and first.state.live.job_ids == [job]
    fake_sky.set_status(job, S.RUNNING)
    first.tick(3)
    launches = len(_launches(fake_sky))

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    again.tick(3)
    assert len(_launches(fake_sky)) == launches == 1
    meta = load_meta("llm")
    assert meta is not None and meta.job_id == job and meta.kind == "managed-job"
    assert [r.run_id for r in list_records("llm")] == state.run_ids  # the ledger is back
    assert state.market is Mode.SPOT and state.cost > 0
    fake_sky.set_status(job, S.SUCCEEDED)
    again.tick()
    assert state.phase == "finished"


@pytest.mark.slow
def test_a_controller_restarted_on_a_fresh_home_counts_earlier_launches_and_stops_at_the_budget(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first launch ran, SkyPilot failed it, a second one runs; the controller restarts on
    a fresh VM where the first launch's record cannot be had (its bucket copy, best effort,
    was never written): the spent cost goes on from the state's (before: the first launch's
    dropped, and `--budget` was overrun by as much)."""
    first = Driver(_state(script, tmp_path, max_restarts=0))
    first.tick()
    fake_sky.set_status(_named(fake_sky, "llm")[-1], S.RUNNING)
    first.tick(3)
    fake_sky.set_status(_named(fake_sky, "llm")[-1], S.FAILED_CONTROLLER)
    first.tick(gap=1)
    fake_sky.set_status(_named(fake_sky, "llm")[-1], S.RUNNING)
    first.tick(2)
    spent, run_ids = first.state.cost, first.state.run_ids
    assert len(run_ids) == 2 and spent > 0
    hourly = list_records("llm")[-1].events[0].hourly_price
    assert hourly is not None
    budget = spent + hourly * 3 * GAP / 3600  # three more looks of the spot launch
    shutil.rmtree(layout.record_uri(str(first.state.ckpt_uri), run_ids[0]).removeprefix("file://"))
    first.state.config = first.state.config.model_copy(update={"budget": budget})
    control.save_state(first.state)
    home = os.environ["MNCLOUD_HOME"]

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    again.tick()
    assert state.cost >= spent  # the first launch's cost is still counted
    again.tick(20)
    assert state.phase == "stopped" and "budget" in state.detail, state.detail
    (live,) = list_records("llm")
    monkeypatch.setenv("MNCLOUD_HOME", home)
    (earlier,) = [r for r in list_records("llm") if r.run_id == run_ids[0]]
    billed = sum(cost_summary(r, first.clock.now).total for r in (earlier, live))
    assert spent < billed <= budget


@pytest.mark.slow
def test_a_launch_made_but_not_recorded_is_found_by_its_run_id_not_its_name(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mncloud.launch import launch

    decoy = _other_run(fake_sky, "llm")

    def launched_then_crash(*args: Any, **kw: Any) -> Any:
        launch(*args, **kw)
        raise Crash  # the job is made; the controller dies before it writes it down

    first = Driver(_state(script, tmp_path), launcher=launched_then_crash)
    with pytest.raises(Crash):
        first.tick()
    made = [i for i in _named(fake_sky, "llm") if i != decoy]
    assert len(made) == 1 and first.state.live is None
    pending = control.load_uri(first.state.config.state_uri or "")
    assert pending is not None and pending.launching is not None

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    assert state.launching is None and state.live is not None
    assert state.live.job_ids == made and state.live.run_id == pending.launching.run_id
    assert len(_launches(fake_sky)) == 1
    again.tick(2)
    assert len(_launches(fake_sky)) == 1 and _status(fake_sky, decoy) == "RUNNING"


def test_a_controller_restarted_as_another_api_user_still_finds_the_launch(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 11: the replacement VM is another user to the API server (no token,
    another user hash); a queue without `all_users` would not list the first VM's job, and
    the new controller would launch a second gang on the same checkpoints."""
    from mncloud.launch import launch

    def launched_then_crash(*args: Any, **kw: Any) -> Any:
        launch(*args, **kw)
        raise Crash

    fake_sky.as_user(User("controller-vm-1", "c0417001"))
    first = Driver(_state(script, tmp_path), launcher=launched_then_crash)
    with pytest.raises(Crash):
        first.tick()
    (made,) = _named(fake_sky, "llm")

    fake_sky.as_user(User("controller-vm-2", "c0417002"))
    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    again.tick(2)
    assert fake_sky.live_jobs("llm") == [made] and len(_launches(fake_sky)) == 1
    assert state.live is not None and state.live.job_ids == [made]
    # The laptop (a third user) stops it: the cancel reaches the VM's job.
    fake_sky.as_user(LAPTOP)
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "vm2"))
    from mncloud.backends.skypilot import SkyPilotBackend

    SkyPilotBackend().down("llm")
    assert fake_sky.live_jobs() == []


@pytest.mark.slow
def test_a_job_group_made_but_not_recorded_is_adopted_with_its_tasks(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--recovery node`: one managed job of several tasks, every one carrying the run id."""
    from mncloud.launch import launch
    from mncloud.render import jobgroup

    script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    # A file:// bucket stands in for the s3:// one the VMs would need (nothing runs here).
    monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)

    def launched_then_crash(*args: Any, **kw: Any) -> Any:
        launch(*args, **kw)
        raise Crash

    first = Driver(_state(script, tmp_path, recovery="node"), launcher=launched_then_crash)
    with pytest.raises(Crash):
        first.tick()
    (job,) = _named(fake_sky, "llm")
    tasks = [t.name for t in fake_sky.job(job).tasks]
    assert len(tasks) == 5  # the lighthouse and 4 nodes

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    meta = load_meta("llm")
    assert meta is not None and meta.kind == "job-group" and meta.job_id == job
    assert meta.tasks == tasks
    fake_sky.set_status(job, S.RUNNING)
    again.tick()
    assert len(_launches(fake_sky)) == 1 and state.mode is Mode.SPOT


def test_a_launch_still_in_flight_when_the_controller_died_is_waited_for_and_adopted(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client died after sending the request; the API server made the job later."""
    import sky

    def sent_then_crash(*args: Any, **kw: Any) -> Any:
        from mncloud.launch import launch

        monkeypatch.setattr(sky, "stream_and_get", lambda *_a, **_k: (_ for _ in ()).throw(Crash))
        launch(*args, **kw)

    fake_sky.held.add("jobs.launch")
    first = Driver(_state(script, tmp_path), launcher=sent_then_crash)
    with pytest.raises(Crash):
        first.tick()
    fake_sky.held.clear()
    in_flight = [r for r in sky.api_status() if r.name == "sky.jobs.launch"]
    assert _named(fake_sky, "llm") == [] and len(in_flight) == 1

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    Driver(state, first.clock).ctl._recover()
    (job,) = _named(fake_sky, "llm")
    assert state.live is not None and state.live.job_ids == [job]
    assert len(_launches(fake_sky)) == 1


def test_a_journaled_launch_never_made_is_made_once_with_its_run_id(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def crash(*_args: Any, **_kw: Any) -> Any:
        raise Crash  # died between the journal and the launch

    first = Driver(_state(script, tmp_path), launcher=crash)
    with pytest.raises(Crash):
        first.tick()
    journaled = control.load_uri(first.state.config.state_uri or "")
    assert journaled is not None and journaled.launching is not None

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    # SkyPilot does not answer: whether it was made is unknown, so nothing is launched and
    # the controller exits non-zero (SkyPilot restarts it), its journal kept.
    fake_sky.unreachable()
    with monkeypatch.context() as patched:
        patched.setattr(first.clock, "sleep", _never)  # `run` must not get to its loop
        with pytest.raises(LaunchUnknown, match="API server is unreachable"):
            Driver(state, first.clock).ctl.run()
    fake_sky.reachable()
    assert _launches(fake_sky) == [] and state.launching is not None
    Driver(state, first.clock).ctl._recover()
    assert len(_named(fake_sky, "llm")) == len(_launches(fake_sky)) == 1
    assert state.live is not None and state.live.run_id == journaled.launching.run_id
    assert state.run_ids == [journaled.launching.run_id]


def _never(*_args: Any, **_kw: Any) -> Any:
    raise AssertionError("not to be called")


# ---------------------------------------------------------------- how a launch ends


@pytest.mark.slow
def test_no_spot_capacity_goes_on_demand_at_once(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path))
    run.tick()
    (job,) = _named(fake_sky, "llm")
    assert run.state.market is Mode.SPOT
    fake_sky.set_status(job, S.FAILED_NO_RESOURCE)
    run.tick(gap=1)  # the same tick, decided again
    assert run.state.market is Mode.ON_DEMAND and run.state.phase == "on-demand"
    assert run.state.spot_missing_since is not None and run.state.preemptions == 0
    assert len(_launches(fake_sky)) == 2 and run.state.switches == 1
    first, _second = sorted(list_records("llm"), key=lambda r: r.created_at)
    assert [e.kind for e in first.events][:2] == ["launch", "failure"]  # never ran, billed 0
    assert cost_summary(first, now=run.clock.now + 3600).total == 0.0


@pytest.mark.slow
def test_no_spot_capacity_in_one_place_tries_spot_in_the_next(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    from mncloud.control.places import ManagedJobPlaces, places_controller

    regions = ["us-central1", "europe-west4"]
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(script, gpus="H100:8", nodes=4, name="llm", bucket=bucket, region=regions)
    state = control.deadline_state(
        spec, LaunchOptions(hours=2, recovery_minutes=10), deadline_s=5 * 3600,
        hours_given=True, spot_price=[10.0, 11.0], on_demand_price=30.0,
    )  # fmt: skip
    clock = FakeClock()
    run = Driver(state, clock)
    run.ctl = places_controller(state, ManagedJobPlaces(), clock=clock)
    run.tick()
    (first,) = _named(fake_sky, "llm")
    assert state.place == 0 and state.market is Mode.SPOT
    fake_sky.set_status(first, S.FAILED_NO_RESOURCE)
    run.tick(gap=1)
    (_spot, (args, _kw)) = fake_sky.called("jobs.launch")
    assert {r.region for r in args[0].resources} == {"europe-west4"}
    assert all(r.use_spot for r in args[0].resources)
    assert state.place == 1 and state.market is Mode.SPOT and state.moves == 1
    assert state.place_missing_since[0] is not None and state.preemptions == 0


@pytest.mark.slow
def test_user_errors_are_retried_up_to_max_restarts_then_the_run_fails_with_the_count(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path, max_restarts=2))
    run.tick()
    for attempt in range(3):
        job = _named(fake_sky, "llm")[-1]
        assert len(_named(fake_sky, "llm")) == attempt + 1
        fake_sky.script(job, [ERROR])  # exit 1; the job's own job_recovery retries nothing
        run.tick(gap=1)
    assert run.state.phase == "failed" and run.state.errors_retried == 2
    assert "an error in your code, retried 2 of --max-restarts 2 times" in run.state.detail
    assert "exit code 1" in run.state.detail and "--max-restarts 0" not in run.state.detail
    assert len(_launches(fake_sky)) == 3
    # Each launch the controller makes retries nothing itself: the controller counts.
    assert all(t.max_restarts == 0 for job in fake_sky.jobs.values() for t in job.tasks)


@pytest.mark.slow
def test_skypilots_own_failures_are_relaunched_uncounted_and_bounded(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path, max_restarts=0))
    run.tick()
    for _ in range(MAX_RELAUNCHES):
        fake_sky.set_status(_named(fake_sky, "llm")[-1], S.FAILED_CONTROLLER)
        run.tick(gap=1)
        assert run.state.phase != "failed"
    assert run.state.errors_retried == 0 and len(_launches(fake_sky)) == MAX_RELAUNCHES + 1
    fake_sky.set_status(_named(fake_sky, "llm")[-1], S.FAILED_CONTROLLER)
    run.tick(gap=1)
    assert run.state.phase == "failed" and "SkyPilot lost the launch" in run.state.detail


def test_a_job_gone_from_the_queue_is_lost_only_after_several_looks(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path))
    run.tick()
    (job,) = _named(fake_sky, "llm")
    fake_sky.jobs.pop(job)
    for _ in range(VANISHED_LOOKS - 1):
        run.tick(gap=1)
        assert run.state.market is Mode.SPOT and len(_launches(fake_sky)) == 1
    run.tick(gap=1)
    assert len(_launches(fake_sky)) == 2 and run.state.relaunches == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "phase", "words"),
    [
        ("CANCELLED", "stopped", "cancelled outside the controller"),
        ("CANCELLING", "stopped", "cancelled outside the controller"),
        ("FAILED_PRECHECKS", "failed", "the launch was refused"),
        # The script refused its input (a checkpoint another model wrote): SkyPilot names the
        # nodes' exit codes; relaunching would refuse again.
        ("FAILED", "failed", "the launch was refused"),
    ],
)
def test_ends_that_stop_the_run(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    status: str,
    phase: str,
    words: str,
) -> None:
    run = Driver(_state(script, tmp_path))
    run.tick()
    refusal = (
        "Job exited with exit codes [116, 116] (user program failure)."
        if status == "FAILED"
        else None
    )
    fake_sky.set_status(_named(fake_sky, "llm")[-1], S(status), reason=refusal)
    run.tick(3)
    assert run.state.phase == phase and words in run.state.detail
    assert len(_launches(fake_sky)) == 1


# --------------------------------------------------------------------------------- down


@pytest.mark.slow
def test_up_deadline_then_down_cancels_the_controller_and_the_training_job(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mncloud.cli import app

    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "https://sky.example.com")
    monkeypatch.chdir(script.parent)
    laptop = tmp_path / "laptop"
    monkeypatch.setenv("MNCLOUD_HOME", str(laptop))
    bucket = f"file://{tmp_path / 'bucket'}"
    args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "4", "--name", "llm", "--yes",
            "--bucket", bucket, "--deadline", "4h", "--hours", "2", "--spot-price", "10",
            "--on-demand-price", "30"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (controller,) = _named(fake_sky, "llm-control")
    other = _other_run(fake_sky, "llm")

    # The controller, on its own VM, launches the training job.
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm")
    vm = Driver(state)
    vm.tick()
    (training,) = [i for i in _named(fake_sky, "llm") if i != other]
    fake_sky.set_status(controller, S.RUNNING)
    fake_sky.set_status(training, S.RUNNING)

    monkeypatch.setenv("MNCLOUD_HOME", str(laptop))  # back on the laptop: no record of it
    result = runner.invoke(app, ["down", "llm", "--now"])
    assert result.exit_code == 0, result.output
    assert _status(fake_sky, controller) == _status(fake_sky, training) == "CANCELLED"
    assert _status(fake_sky, other) == "RUNNING"  # same name, another run: untouched
    said = " ".join(result.stdout.split())
    assert f"cancelled controller job {controller} and training job {training}" in said
    assert all(kw.get("name") is None for _args, kw in fake_sky.called("jobs.cancel"))
    final = control.load_uri(state.config.state_uri or "")
    assert final is not None and final.phase == "stopped"

    again = runner.invoke(app, ["down", "llm", "--now"])
    assert again.exit_code == 0, again.output
    assert "nothing of the run was live" in " ".join(again.stdout.split())


@pytest.mark.slow
def test_down_finds_a_training_job_the_state_only_journaled(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller was cancelled mid-launch: the job's id never reached the state, its
    run id did; `down` finds it by that."""
    from mncloud.launch import launch

    state = _state(script, tmp_path)

    def launched_then_crash(*args: Any, **kw: Any) -> Any:
        launch(*args, **kw)
        raise Crash

    with pytest.raises(Crash):
        Driver(state, launcher=launched_then_crash).tick()
    (training,) = _named(fake_sky, "llm")
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
    laptop = control.load_uri(state.config.state_uri or "")
    assert laptop is not None and laptop.job_ids == []
    control.save_state(laptop)

    from mncloud.operate import stop_run

    status = stop_run("llm")
    assert _status(fake_sky, training) == "CANCELLED"
    assert f"cancelled training job {training}" in status.detail


@pytest.mark.slow
def test_down_cut_off_after_the_controller_says_what_may_still_be_live(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SkyPilot stops answering once the controller's job is cancelled: one line that says
    what was cancelled and which training job may still run; a second `down` finishes."""
    from mncloud.control import down
    from mncloud.errors import BackendError
    from mncloud.operate import stop_run

    state = _state(script, tmp_path)
    state.controller_job_id = fake_sky.add_job("llm-control", S.RUNNING)
    control.save_state(state)
    Driver(state).tick()
    (training,) = _named(fake_sky, "llm")
    fresh = down._fresh

    def then_unreachable(st: control.ControlState) -> control.ControlState:
        found = fresh(st)
        fake_sky.unreachable()
        return found

    with monkeypatch.context() as patched:
        patched.setattr(down, "_fresh", then_unreachable)
        with pytest.raises(BackendError) as caught:
            stop_run("llm")
    said = str(caught.value)
    assert "API server is unreachable" in said and "\n" not in said
    assert f"controller job {state.controller_job_id} cancelled" in said
    assert "may still be live" in said and _status(fake_sky, training) == "PENDING"
    fake_sky.reachable()
    assert f"cancelled training job {training}" in stop_run("llm").detail
    assert _status(fake_sky, training) == "CANCELLED"


@pytest.mark.slow
def test_down_with_the_controller_state_unreadable_cancels_no_training_job_blind(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    import shutil

    from mncloud.errors import BackendError
    from mncloud.operate import stop_run

    state = _state(script, tmp_path)
    Driver(state).tick()
    shutil.rmtree(tmp_path / "bucket" / "llm" / "control")
    with pytest.raises(BackendError, match=r"state at .* cannot be read.*may still be live"):
        stop_run("llm")
