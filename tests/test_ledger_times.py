"""The ledger bills what SkyPilot ran (issue #43 point 3 and 12): cost segments opened and
closed at the managed job's own times in the queue (`start_at`, `last_recovered_at`,
`job_duration`, `end_at`), so waiting for VMs (PENDING, STARTING, RECOVERING) bills nothing
and running bills; CANCELLING bills until SkyPilot's CANCELLED. On `tests/fakesky/`, whose
`running_seconds` are the seconds VMs ran each job (what the cloud bills)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sky
from sky.jobs import ManagedJobStatus as S

from mncloud import control
from mncloud.backends.base import RunState
from mncloud.backends.skypilot import SkyPilotBackend
from mncloud.deadline.policy import Mode
from mncloud.errors import BackendError
from mncloud.records.ledger import cost_segments, cost_summary, observed_spot_hazard
from mncloud.records.model import RunRecord
from mncloud.records.store import list_records
from tests.fakesky import PREEMPT, FakeSky
from tests.test_control import GAP
from tests.test_control_cloud import Driver, _fresh_vm, _named, _state
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog


def _billed_s(name: str, now: float) -> float:
    """Seconds the ledgers of run `name`'s records bill up to `now`."""
    return sum(s.end - s.start for r in list_records(name) for s in cost_summary(r, now).segments)


def _looks(run: Driver, n: int, gap: float = GAP) -> None:
    for _ in range(n):
        if run.state.final:
            return
        run.ctl.look()
        run.clock.now += gap


def _launched(
    train: Path, fake: FakeSky, tmp_path: Path, *, spot: bool, **flags: Any
) -> SkyPilotBackend:
    """`mncloud up` of a plain managed job (its run record written, job 7)."""
    from mncloud.launch import launch
    from mncloud.request import build_spec

    fake.next_job_id = 7
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(train, gpus="H100:8", nodes=4, spot=spot, name="llm", bucket=bucket,
                      **flags)  # fmt: skip
    launch(spec, approve=lambda _plan: True)
    return SkyPilotBackend()


class Clock:
    """`time.time` for a test: moves only when told."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = time.time()
        monkeypatch.setattr(time, "time", lambda: self.now)


# ----------------------------------------------------------------- the deadline controller


def test_a_deadline_spot_job_bills_its_running_not_its_waiting(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """PENDING 2 looks, RUNNING 3, RECOVERING 2, RUNNING 2: billed = the seconds VMs ran it
    (before: from the launch, the wait for VMs included)."""
    state = _state(script, tmp_path)
    state.config = state.config.model_copy(update={"deadline_s": 48 * 3600})
    control.save_state(state)
    run = Driver(state)
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    _looks(run, 2)  # PENDING: SkyPilot looks for spot VMs
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 3)
    fake_sky.set_status(job, S.RECOVERING)
    _looks(run, 2)
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 2)
    ran = fake_sky.running_seconds(job)[0]
    assert ran == 5 * GAP
    assert _billed_s("llm", run.clock.now) == pytest.approx(ran)
    (record,) = list_records("llm")
    price = next(e for e in record.events if e.kind == "launch").hourly_price
    assert cost_summary(record, run.clock.now).total == pytest.approx(price * ran / 3600)


def test_a_launch_cancelled_outside_bills_until_skypilot_says_cancelled(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """`sky jobs cancel`: CANCELLING while the VMs are torn down (billed), CANCELLED at its
    `end_at`; only then the run stops (before: stopped at CANCELLING, its segment never
    closed)."""
    run = Driver(_state(script, tmp_path))
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 2)
    fake_sky.cancel_polls = 3  # a slow teardown
    sky.get(sky.jobs.cancel(job_ids=[job]))  # `sky jobs cancel`
    _looks(run, 2)
    assert not run.state.final and fake_sky.job(job).tasks[0].status is S.CANCELLING
    _looks(run, 2)
    assert run.state.phase == "stopped"
    (record,) = list_records("llm")
    assert _ends(record) == [("finish", fake_sky.job(job).tasks[0].end_at)]  # one, SkyPilot's
    ran = fake_sky.running_seconds(job)[0]
    assert ran == 4 * GAP
    assert _billed_s("llm", run.clock.now + 7200) == pytest.approx(ran)


def test_a_stint_seen_recovering_is_not_billed_again_when_cancelled() -> None:
    """Preempted the instant it started (ran 0 s), seen RECOVERING, then cancelled: SkyPilot's
    `job_duration` of a job ended from RECOVERING counts the wait since the stint began
    (`sky/jobs/utils.py`), and CANCELLING reads as VMs held; nothing is billed (before: the
    whole wait, job-group soak seed 1008's 1803 s of 1 s run)."""
    from mncloud.records.ledger import RunTimes, catch_up, cost_segments
    from mncloud.records.model import Event

    launch = Event(kind="launch", time=0.0, spot=True, hourly_price=40.0)
    record = RunRecord.model_construct(events=[launch, Event(kind="waiting", time=0.0)])

    def follow(times: RunTimes, now: float) -> None:
        for kind, at in catch_up(record, times, now, spot=True):
            price = 40.0 if kind == "running" else None
            record.events.append(Event(kind=kind, time=at, spot=True, hourly_price=price))

    follow(RunTimes(running=False, ran_s=0.0, since=100.0, recovering=True), 300.0)
    follow(RunTimes(running=True, ran_s=200.0, since=100.0), 300.0)  # CANCELLING
    follow(RunTimes(running=False, ran_s=500.0, since=100.0, ended_at=600.0), 600.0)
    assert sum(s.end - s.start for s in cost_segments(record, 7200.0)) == 0.0


@pytest.mark.parametrize("end", [S.CANCELLED, S.FAILED_NO_RESOURCE])
def test_a_launch_adopted_after_its_job_ended_bills_nothing_and_stays_closed(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    end: S,
) -> None:
    """The controller dies mid-launch; the server makes the job, which ends (cancelled, or no
    capacity) before the controller is back 7 minutes later and adopts it: its `launch` event
    is written then, after SkyPilot's `end_at`. Before: the end event went in before the
    launch, and the record billed from the adoption on, open for ever (cloud soak seed 1000
    with a controller killed mid-launch: 60 s of a job that never ran). Now: nothing billed."""
    from tests.test_lease_in_flight import _dies_launching

    _controller, dead, run_id = _dies_launching(fake_sky, monkeypatch, script, tmp_path)
    fake_sky.finish_in_flight()
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, end)
    dead.clock.now += 420.0
    back = Driver(_fresh_vm(monkeypatch, tmp_path, "controller-vm-2"), dead.clock)
    back.ctl._recover()
    back.tick(3)
    (record,) = [r for r in list_records("llm") if r.run_id == run_id]
    assert fake_sky.running_seconds(job) == [0.0]
    assert cost_summary(record, now=back.clock.now + 7200).total == 0.0


def _ends(record: RunRecord) -> list[tuple[str, float]]:
    return [(e.kind, e.time) for e in record.events if e.kind in ("finish", "failure")]


@pytest.mark.slow
@pytest.mark.parametrize("end", [S.SUCCEEDED, S.FAILED])
def test_a_deadline_launch_that_ended_has_one_end_event_at_skypilot_s_end(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    end: S,
) -> None:
    """The queue's `end_at` closes the record; the controller adds no end of its own (before:
    a second `finish`/`failure` at the look that saw it)."""
    run = Driver(_state(script, tmp_path))
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 2)
    fake_sky.set_status(job, end)
    _looks(run, 2)
    kind = "finish" if end is S.SUCCEEDED else "failure"  # FAILED: launched again
    first, *later = list_records("llm")
    assert _ends(first) == [(kind, fake_sky.job(job).tasks[0].end_at)]
    assert all(not _ends(record) for record in later)


@pytest.mark.parametrize(("ran", "recovery"), [(True, "gang"), (False, "gang"), (True, "node")])
def test_down_ends_the_live_launch_s_record_at_skypilot_s_end(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ran: bool,
    recovery: str,
) -> None:
    """`mncloud down` on the controller's home a tick after its last look (none comes again):
    the live launch's record ends at SkyPilot's `end_at`, the state's cost is what ran (before:
    the record open until the `down`, a job that never ran billed a tick, cloud soak seed 7;
    a job group's launch kept no run id, so its record stayed open, job-group seed 1020)."""
    from mncloud.control.down import stop_cloud
    from mncloud.render import jobgroup

    if recovery == "node":  # a job group
        script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
        monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    run = Driver(_state(script, tmp_path, recovery=recovery))
    _looks(run, 1)  # the launch: no look sees it wait
    (job,) = _named(fake_sky, "llm")
    if ran:
        fake_sky.set_status(job, S.RUNNING)
        _looks(run, 1)
    run.clock.now += GAP
    stop_cloud(run.state, 0.0, wait_s=30.0, sleep=lambda _s: None)
    (record,) = list_records("llm")
    ended = fake_sky.job(job).tasks[-1].end_at if ran else record.events[0].time  # its launch
    assert _ends(record) == [("finish", ended)]
    ran_s = fake_sky.running_seconds(job)[-1]
    assert ran_s == (2 * GAP if ran else 0.0)
    assert _billed_s("llm", run.clock.now + 7200) == pytest.approx(ran_s)
    price = next(e for e in record.events if e.kind == "launch").hourly_price
    stopped = control.load_uri(run.state.config.state_uri)
    assert stopped is not None and stopped.phase == "stopped"
    assert stopped.cost == pytest.approx(price * ran_s / 3600)


@pytest.mark.parametrize("recovery", ["gang", "node"])
def test_down_from_a_laptop_ends_the_bucket_s_records_at_skypilot_s_end(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recovery: str,
) -> None:
    """The controller's last look saw its job wait for VMs; the cloud then gave them and the
    job trained, with no look after (the controller stalled, its token spent). `mncloud down`
    from a laptop, which holds neither the record nor `skypilot.json`: the bucket's copy of
    the record ends at SkyPilot's `end_at` and bills what ran, as does the stopped state (before:
    closed by no home, the stint billed nowhere, a −7457 s soak ledger)."""
    from mncloud.control.down import stop_cloud
    from mncloud.records.store import fetch_record
    from mncloud.render import jobgroup

    if recovery == "node":  # a job group
        script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
        monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    run = Driver(_state(script, tmp_path, recovery=recovery))
    _looks(run, 2)  # the launch; a look sees it wait
    (job,) = _named(fake_sky, "llm")
    (run_id,) = run.state.run_ids
    fake_sky.set_status(job, S.RUNNING)
    run.clock.now += 3 * GAP  # it trains; no look comes
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
    laptop = control.load_uri(run.state.config.state_uri)
    assert laptop is not None and list_records("llm") == []
    stop_cloud(laptop, 0.0, wait_s=30.0, sleep=lambda _s: None)
    record = fetch_record(f"file://{tmp_path / 'bucket'}/llm", run_id)
    assert record is not None and record.finished
    assert _ends(record) == [("finish", fake_sky.job(job).tasks[-1].end_at)]
    ran_s = fake_sky.running_seconds(job)[-1]
    assert ran_s == 3 * GAP
    assert cost_summary(record, now=run.clock.now + 7200).total > 0
    billed = sum(s.end - s.start for s in cost_segments(record, run.clock.now + 7200))
    assert billed == pytest.approx(ran_s)
    price = next(e for e in record.events if e.kind == "launch").hourly_price
    stopped = control.load_uri(run.state.config.state_uri)
    assert stopped is not None and stopped.phase == "stopped"
    assert stopped.cost == pytest.approx(price * ran_s / 3600)


def test_plan_learn_counts_no_preemption_of_a_job_that_never_ran(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """A spot job PENDING past `capacity_wait_s` is spot missing, not a preemption of a
    running job: `plan --learn` learns none from it (before: one)."""
    run = Driver(_state(script, tmp_path))
    wait = run.state.config.capacity_wait_s / run.state.config.time_scale
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    _looks(run, 3, gap=wait)
    assert run.state.mode is not Mode.SPOT or run.state.market is not Mode.SPOT
    records = list_records("llm")
    assert all(e.kind != "preemption" for r in records for e in r.events)
    learned = observed_spot_hazard(records, min_node_hours=0.0)
    assert all(count == 0 for _hazard, count, _hours in learned.values())
    assert fake_sky.running_seconds(job) == [0.0]


# --------------------------------------------------------------------- plain managed jobs


def test_a_plain_spot_job_bills_from_its_start_not_its_submission(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PENDING 20 min, RUNNING 1 h, preempted 10 min, RUNNING 30 min, SUCCEEDED: 1.5 h
    billed (before: 2 h, from the submission)."""
    clock = Clock(monkeypatch)
    backend = _launched(script, fake_sky, tmp_path, spot=True)
    for minutes, step in [(20, S.RUNNING), (60, PREEMPT), (10, S.RUNNING), (30, S.SUCCEEDED)]:
        clock.now += minutes * 60
        fake_sky.script(7, [step])
        backend.status("llm")
    assert backend.status("llm").state is RunState.SUCCEEDED
    assert fake_sky.running_seconds(7) == [5400.0]
    assert _billed_s("llm", clock.now + 3600) == pytest.approx(5400.0)
    (record,) = list_records("llm")
    assert [s.opened_by for s in cost_summary(record).segments if s.hours] == ["running"] * 2


def test_a_job_group_bills_its_nodes_running_seconds(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--recovery node`: the ledger follows each node task's queue times: PENDING 20 min,
    4 nodes RUNNING 1 h, node 1 replaced in 10 min, all 30 min more: billed = the nodes'
    mean run seconds at the all-nodes price (before: 2 h, from the submission)."""
    from mncloud.render import jobgroup

    script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    clock = Clock(monkeypatch)
    backend = _launched(script, fake_sky, tmp_path, spot=True, recovery="node")
    _lighthouse, *nodes = [t.name for t in fake_sky.job(7).tasks]
    for minutes, status, task in [(20, S.RUNNING, None), (60, S.RECOVERING, nodes[1]),
                                  (10, S.RUNNING, nodes[1]), (30, S.SUCCEEDED, None)]:  # fmt: skip
        clock.now += minutes * 60
        fake_sky.set_status(7, status, task=task)
        backend.status("llm")
    assert backend.status("llm").state is RunState.SUCCEEDED
    ran = fake_sky.running_seconds(7)[1:]
    assert sorted(ran) == [5400.0, 6000.0, 6000.0, 6000.0]
    assert _billed_s("llm", clock.now + 3600) == pytest.approx(sum(ran) / len(ran))


def test_a_plain_job_group_with_a_failed_node_is_cancelled_and_billed_to_its_end(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #52 point 1: plain `up --recovery node`, node 1 FAILED past its restarts after
    1 h while the others train on. The run is FAILED, so its group's rest is cancelled (not
    left training unsteered), and its record bills until SkyPilot ended the last task (before:
    the record ended at the failure while the other nodes ran and billed)."""
    from mncloud.render import jobgroup

    script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    clock = Clock(monkeypatch)
    backend = _launched(script, fake_sky, tmp_path, spot=True, recovery="node")
    _lighthouse, *nodes = [t.name for t in fake_sky.job(7).tasks]
    fake_sky.cancel_polls = 3
    clock.now += 600
    fake_sky.set_status(7, S.RUNNING)
    backend.status("llm")
    clock.now += 3600
    fake_sky.set_status(7, S.FAILED, task=nodes[1], reason="node 1's program exited 1")
    assert backend.status("llm").state is RunState.FAILED
    assert ((), {"job_ids": [7]}) in fake_sky.called("jobs.cancel")
    for _ in range(10):
        clock.now += 300
        backend.status("llm")
    assert fake_sky.live_jobs("llm") == []
    ran = fake_sky.running_seconds(7)[1:]
    assert _billed_s("llm", clock.now + 3600) == pytest.approx(sum(ran) / len(ran))
    (record,) = list_records("llm")
    assert [e.kind for e in record.events].count("failure") == 1


def test_a_plain_job_whose_cancel_is_slow_bills_until_cancelled(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`down` asks, SkyPilot tears down slowly (CANCELLING past the wait): the record ends at
    SkyPilot's CANCELLED `end_at`, not when the cancel was asked."""
    from mncloud.backends.skypilot import cancel

    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "wait_s", 0.0)
    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "sleep", lambda _s: None)
    clock = Clock(monkeypatch)
    backend = _launched(script, fake_sky, tmp_path, spot=False)
    fake_sky.set_status(7, S.RUNNING)
    clock.now += 600
    fake_sky.cancel_polls = 4
    with pytest.raises(BackendError):
        backend.down("llm")
    clock.now += 300
    assert backend.status("llm").state is RunState.CANCELLED  # CANCELLING
    (record,) = list_records("llm")
    assert not any(e.kind == "finish" for e in record.events)
    while fake_sky.live_jobs("llm"):
        clock.now += 60
        backend.status("llm")
    (record,) = list_records("llm")
    end = fake_sky.job(7).tasks[0].end_at
    assert next(e for e in record.events if e.kind == "finish").time == end
    assert _billed_s("llm", clock.now + 3600) == pytest.approx(fake_sky.running_seconds(7)[0])


def test_a_cluster_run_bills_from_its_cluster_s_launch(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up --cluster`: the cluster came UP 10 min after `up` sent it (SkyPilot's
    `launched_at`); billed from there until `down` (before: from `up`)."""
    from mncloud.launch import launch
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions

    clock = Clock(monkeypatch)
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(script, gpus="H100:8", nodes=4, spot=False, name="llm", bucket=bucket)
    launch(spec, LaunchOptions(cluster=True, idle_minutes=30), approve=lambda _plan: True)
    up = int(clock.now) + 600
    fake_sky.clusters["llm"]["record"]["launched_at"] = up
    clock.now += 3600
    backend = SkyPilotBackend()
    assert backend.status("llm").times is not None
    clock.now += 600
    backend.down("llm")
    assert _billed_s("llm", clock.now + 3600) == pytest.approx(clock.now - up)
