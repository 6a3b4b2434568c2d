"""The SkyPilot fake itself (`tests/fakesky/`): it holds to the real SDK where tests lean on
it: signatures, the client's own conversion, the server's answers and its cancel by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.fakesky import FakeSky


def _task(restarts: int = 1) -> Any:
    import sky

    task = sky.Task(name="t", run="echo hi")
    task.set_resources(sky.Resources(job_recovery={"max_restarts_on_errors": restarts}))
    return task


def test_calls_it_does_not_fake_fail_loudly(fake_sky: FakeSky) -> None:
    import sky
    import sky.jobs
    from sky.client import sdk

    for call in (lambda: sky.optimize(None), lambda: sky.jobs.pool_status("p"), sdk.api_start):
        with pytest.raises(AssertionError, match="unfaked SkyPilot call sky"):
            call()


def test_a_cluster_launch_and_exec_go_through_the_clients_own_work(fake_sky: FakeSky) -> None:
    """`up --cluster` and `exec`: the YAML the client sent, the autostop timer the server
    keeps, a new job per exec, and exec refused on a cluster that is gone."""
    import sky
    from sky import exceptions as sx

    with pytest.raises(TypeError):
        sky.launch(_task(), cluster_name="c", idle_minutes=5)  # the real name is ..._to_autostop
    job_id, _handle = sky.stream_and_get(
        sky.launch(_task(), cluster_name="c", idle_minutes_to_autostop=5, down=True)
    )
    (record,) = sky.get(sky.status(["c"]))
    assert job_id == 1 and record["autostop"] == 5 and record["to_down"] is True
    again, _handle = sky.stream_and_get(sky.exec(_task(), cluster_name="c"))
    assert again == 2 and len(fake_sky.cluster_yamls["c"]) == 2
    assert "echo hi" in fake_sky.cluster_yamls["c"][1]
    sky.get(sky.autostop("c", 30, down=True))
    assert sky.get(sky.status(["c"]))[0]["autostop"] == 30
    sky.get(sky.down("c"))
    with pytest.raises(sx.ClusterDoesNotExist):
        sky.stream_and_get(sky.exec(_task(), cluster_name="c"))


def test_every_call_is_bound_to_the_real_signature(fake_sky: FakeSky) -> None:
    import sky
    import sky.jobs

    with pytest.raises(TypeError):
        sky.jobs.cancel(job_id=[1])  # the real parameter is job_ids
    with pytest.raises(TypeError):
        sky.jobs.queue_v2()  # refresh is required
    with pytest.raises(TypeError):
        sky.get("req", 5)
    assert fake_sky.calls == []


def test_launch_runs_the_clients_own_conversion(fake_sky: FakeSky) -> None:
    import sky
    import sky.jobs

    with pytest.raises(TypeError, match="string"):  # convert_entrypoint_to_dag, at once
        sky.jobs.launch("echo hi")
    assert fake_sky.calls == []
    (job_id,), _handle = sky.stream_and_get(sky.jobs.launch(_task(4), name="run"))
    job = fake_sky.job(job_id)
    assert job.name == "run" and "max_restarts_on_errors: 4" in job.yaml
    assert job.tasks[0].max_restarts == 4 and job.tasks[0].name == "t"


def test_the_queue_answers_as_the_server_does(fake_sky: FakeSky) -> None:
    """Only the fields asked for (plus job_id, task_id, status), through SkyPilot's encoder and
    decoder: the default fields carry no failure reason."""
    import sky
    import sky.jobs
    from sky.jobs import ManagedJobStatus as S

    job_id = fake_sky.add_job("run")
    fake_sky.set_status(job_id, S.FAILED_NO_RESOURCE, reason="no H100 anywhere")
    records, total, counts, everything = sky.get(sky.jobs.queue_v2(refresh=False))
    assert (total, counts, everything) == (1, {"FAILED_NO_RESOURCE": 1}, 1)
    assert records[0].status is S.FAILED_NO_RESOURCE and records[0].failure_reason is None
    (record,), *_ = sky.get(sky.jobs.queue_v2(refresh=False, fields=["failure_reason"]))
    assert record.failure_reason == "no H100 anywhere" and record.job_name is None
    assert sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=True))[0] == []


def test_cancel_by_name_is_skypilots(fake_sky: FakeSky) -> None:
    """One live job of the name: cancelled. Two: nothing, and no error (the message stays in
    the server's log). None: nothing."""
    import sky
    import sky.jobs
    from sky.jobs import ManagedJobStatus as S

    one = fake_sky.add_job("a")
    assert sky.get(sky.jobs.cancel(name="a")) is None
    assert fake_sky.job(one).tasks[0].status is S.CANCELLING
    b1, b2 = fake_sky.add_job("b"), fake_sky.add_job("b")
    assert sky.get(sky.jobs.cancel(name="b")) is None
    assert fake_sky.job(b1).live and fake_sky.job(b2).live
    assert sky.get(sky.jobs.cancel(name="nobody")) is None
    assert fake_sky.messages[-1] == "No running job found with name 'nobody'."
    with pytest.raises(ValueError, match="Can only specify one of"):
        sky.get(sky.jobs.cancel(name="b", job_ids=[b1]))


def test_requests_in_flight_carry_the_servers_names_and_finish_on_their_own(
    fake_sky: FakeSky,
) -> None:
    """`sky.api_status()` names a request as the server does (`sky.jobs.launch`), and the
    server finishes it without its client (`finish_after`, `finish_in_flight`)."""
    import sky
    import sky.jobs
    from sky import exceptions as sx
    from sky.server.constants import REQUEST_NAME_PREFIX

    fake_sky.held.add("jobs.launch")
    fake_sky.finish_after = 1

    def in_flight() -> list[Any]:  # the server's own daemons are listed too: left out
        return [r for r in sky.api_status() if r.user_id != "skypilot-system"]

    sky.jobs.launch(_task(), name="a")
    (request,) = in_flight()
    assert request.name == REQUEST_NAME_PREFIX + "jobs.launch" == "sky.jobs.launch"
    assert fake_sky.live_jobs() == []
    with pytest.raises(sx.ClusterNotUpError):  # one later request: still in flight, and no
        sky.get(sky.jobs.queue_v2(refresh=False))  # jobs controller yet, as on the server
    sky.get(sky.jobs.queue_v2(refresh=False))  # the next: it finished by itself
    assert in_flight() == [] and fake_sky.live_jobs("a") != []
    fake_sky.finish_after = None
    sky.jobs.launch(_task(), name="b")
    fake_sky.finish_in_flight()
    assert in_flight() == [] and len(fake_sky.live_jobs()) == 2


def test_each_user_sees_only_their_jobs_unless_all_users(fake_sky: FakeSky) -> None:
    import sky
    import sky.jobs

    from tests.fakesky import LAPTOP, User

    vm = User("controller-vm", "c0417001")
    mine = fake_sky.add_job("a", user=LAPTOP)
    theirs = fake_sky.add_job("a", user=vm)

    def seen(**kw: Any) -> set[int]:
        records, *_ = sky.get(sky.jobs.queue_v2(refresh=False, **kw))
        return {r.job_id for r in records}

    assert seen() == {mine} and seen(all_users=True) == {mine, theirs}
    (record,) = sky.get(
        sky.jobs.queue_v2(refresh=False, job_ids=[theirs], all_users=True, fields=None)
    )[0]
    assert record.user_hash == vm.user_hash
    fake_sky.as_user(vm)
    assert seen() == {theirs}
    sky.get(sky.jobs.cancel(job_ids=[mine]))  # by id: any user's job
    seen(all_users=True)  # the teardown ends (`cancel_polls` reads)
    assert fake_sky.live_jobs() == [theirs]


def test_failed_and_lost_answers(fake_sky: FakeSky) -> None:
    """`fail`: the server refuses, nothing made; `lose`: the job is made, the client's wait
    raises, a later `sky.get` of the same request has the answer."""
    import sky
    import sky.jobs
    from sky import exceptions as sx

    fake_sky.fail("jobs.launch", ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        sky.stream_and_get(sky.jobs.launch(_task(), name="a"))
    assert fake_sky.live_jobs() == []
    fake_sky.lose("jobs.launch")
    request_id = sky.jobs.launch(_task(), name="a")
    with pytest.raises(sx.ApiServerConnectionError):
        sky.stream_and_get(request_id)
    (job,) = fake_sky.live_jobs("a")
    assert sky.get(request_id)[0] == [job]


def test_running_seconds_count_only_running(fake_sky: FakeSky, monkeypatch: Any) -> None:
    """What the cloud bills: the seconds a task held RUNNING, not PENDING nor RECOVERING."""
    import time

    from sky.jobs import ManagedJobStatus as S

    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    job = fake_sky.add_job("a", S.PENDING)
    now[0] += 50
    fake_sky.set_status(job, S.RUNNING)
    now[0] += 100
    fake_sky.set_status(job, S.RECOVERING)
    now[0] += 30
    fake_sky.set_status(job, S.RUNNING)
    now[0] += 20
    assert fake_sky.running_seconds(job) == [120.0]
    record = fake_sky.jobs[job].tasks[0]
    assert record.start_at == 1050.0 and record.last_recovered_at == 1180.0
