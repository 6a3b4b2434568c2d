"""The SkyPilot fake itself (`tests/fakesky.py`): it holds to the real SDK where tests lean on
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
