"""The cloud deadline controller when SkyPilot fails (issue #43): errors in a look are unsure,
bounded; a lost launch answer is resolved, never failed; a job group's failed node takes its
siblings down before a relaunch; one controller per run; no phantom run after a refused `up`.

On `tests/fakesky/` (its `fail`, `lose`, `cancel_polls`, users); the rest real, as in
`tests/test_control_cloud.py`, whose helpers these tests share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sky
from sky.jobs import ManagedJobStatus as S
from typer.testing import CliRunner

from mncloud import control
from mncloud.backends.skypilot.meta import load_meta
from mncloud.deadline.policy import Mode
from mncloud.records.ledger import cost_summary
from mncloud.records.store import list_records
from tests.fakesky import FakeSky
from tests.test_control import GAP
from tests.test_control_cloud import Driver, _fresh_vm, _launches, _named, _state
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
runner = CliRunner()


def _looks(run: Driver, n: int, gap: float = GAP) -> None:
    """`n` looks of `Controller.run` (the journal first after an error), `gap` apart."""
    for _ in range(n):
        if run.state.final:
            return
        run.ctl.look()
        run.clock.now += gap


def test_a_cancel_confirmed_after_wait_s_still_leads_to_the_on_demand_launch(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 1: past the deadline the controller switches spot → on-demand; the
    spot job's teardown outlasts `cancel.WAIT_S`. The look is unsure, not failed: the next one
    finishes the journaled take-down and makes the on-demand launch, once."""
    from mncloud.backends.skypilot import cancel

    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "wait_s", 0.0)
    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "sleep", lambda _s: None)
    run = Driver(_state(script, tmp_path))
    _looks(run, 1)
    (spot,) = _named(fake_sky, "llm")
    fake_sky.set_status(spot, S.RUNNING)
    fake_sky.cancel_polls = 3  # slower than WAIT_S (0 here)
    run.clock.now += 5 * 3600  # past the 4 h deadline: on-demand now
    _looks(run, 1, gap=1)
    assert run.state.phase != "failed" and "unsure" in run.state.detail
    assert run.state.launching is not None and len(_launches(fake_sky)) == 1
    for _ in range(3):  # the VMs go while no look comes (`sky jobs queue` sees it)
        sky.get(sky.jobs.queue_v2(refresh=False, job_ids=[spot], all_users=True))
    assert fake_sky.job(spot).tasks[0].status is S.CANCELLED
    run.clock.now += GAP / 2
    _looks(run, 3, gap=1)
    assert run.state.market is Mode.ON_DEMAND and run.state.phase == "on-demand"
    assert fake_sky.live_jobs("llm") == [max(_named(fake_sky, "llm"))] != [spot]
    assert len(_launches(fake_sky)) == 2
    # The spot launch's record ends once, at SkyPilot's `end_at` (before: never, so it billed
    # on beside the on-demand one, `bench/cloud_soak.sh` seed 4's 604 s; then at the next look).
    first = list_records("llm")[0]
    ends = [(e.kind, e.time) for e in first.events if e.kind in ("finish", "failure")]
    assert ends == [("finish", fake_sky.job(spot).tasks[0].end_at)]
    billed = sum(s.end - s.start for s in cost_summary(first, run.clock.now + 3600).segments)
    assert billed == pytest.approx(fake_sky.running_seconds(spot)[0])


def test_a_lost_launch_answer_is_resolved_from_the_queue_never_failed(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """Issue #43 point 6: the stream of `jobs.launch` breaks and the request's answer is lost
    too; the job runs. The launch is found by its run id in the queue: adopted, billed, not
    `failed`, and nothing launched a second time."""
    fake_sky.lose("jobs.launch", times=2)  # stream_and_get, then sky.get of the request
    run = Driver(_state(script, tmp_path))
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    meta = load_meta("llm")
    assert meta is not None and meta.error is None and meta.job_id == job
    assert run.state.market is Mode.SPOT and run.state.phase == "spot"
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 3)
    assert len(_launches(fake_sky)) == 1 and fake_sky.live_jobs("llm") == [job]
    kinds = [e.kind for r in list_records("llm") for e in r.events]
    assert kinds == ["launch", "waiting", "running"]  # one launch, billed from its start


def test_api_errors_are_unsure_then_bounded_and_the_launch_is_cancelled(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """Issue #43 point 1: an API blip in a look is looked at again with backoff; errors that
    go on past `UNSURE_LOOKS` fail the run, and the job it launched is cancelled, not left
    training unsteered."""
    from mncloud.control.unsure import UNSURE_LOOKS, backoff_s
    from mncloud.errors import BackendError

    run = Driver(_state(script, tmp_path))
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, S.RUNNING)
    real_step = run.ctl.step

    def blip() -> None:
        raise BackendError("cannot get the status: SkyPilot's API server is unreachable")

    run.ctl.step = blip  # type: ignore[method-assign]
    _looks(run, 2)
    assert run.state.phase == "spot" and run.ctl.unsure == 2 and backoff_s(2) > backoff_s(1)
    run.ctl.step = real_step  # type: ignore[method-assign]
    _looks(run, 1)
    assert run.ctl.unsure == 0 and fake_sky.live_jobs("llm") == [job]
    run.ctl.step = blip  # type: ignore[method-assign]
    _looks(run, UNSURE_LOOKS + 1)
    assert run.state.phase == "failed" and f"{UNSURE_LOOKS} looks" in run.state.detail
    assert "its launch was cancelled" in run.state.detail
    assert fake_sky.live_jobs() == [] and len(_launches(fake_sky)) == 1


def _group_run(
    script: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_sky: FakeSky,
    **flags: Any,
) -> tuple[Driver, int]:
    """A `--recovery node` deadline run whose job group (a lighthouse, 4 nodes) runs."""
    from mncloud.render import jobgroup

    script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    run = Driver(_state(script, tmp_path, recovery="node", **flags))
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 1)
    return run, job


@pytest.mark.parametrize("max_restarts", [1, 0], ids=["relaunch", "run-ends"])
def test_a_failed_node_of_a_job_group_cancels_its_siblings_before_the_relaunch(
    max_restarts: int,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 4: one node FAILED, SkyPilot keeps the other nodes training; the
    controller's relaunch must not make a second gang beside them, and a run the failure
    ends (no restart left) must not leave them training unsteered (#58: the cancel is the
    controller's own; nothing else ends them)."""
    run, job = _group_run(script, tmp_path, monkeypatch, fake_sky, max_restarts=max_restarts)
    node = fake_sky.job(job).tasks[2].name
    fake_sky.set_status(job, S.FAILED, task=node, reason="node 1's program exited 1")
    for _ in range(4):
        _looks(run, 1, gap=1)
        assert len(fake_sky.live_jobs("llm")) <= 1
    assert fake_sky.called("jobs.cancel"), "the failed group's rest was never cancelled"
    assert all(t.status.is_terminal() for t in fake_sky.job(job).tasks)
    if max_restarts:
        assert len(_launches(fake_sky)) == 2 and fake_sky.live_jobs("llm") != [job]
        assert run.state.errors_retried == 1
    else:
        assert run.state.phase == "failed" and len(_launches(fake_sky)) == 1


def test_one_recovering_node_is_not_spot_gone_for_the_group(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 4: SkyPilot replaces one node of a job group while the others train;
    spot is there (no preemption counted, nothing relaunched). All nodes recovering: gone."""
    run, job = _group_run(script, tmp_path, monkeypatch, fake_sky)
    tasks = [t.name for t in fake_sky.job(job).tasks]
    fake_sky.set_status(job, S.RECOVERING, task=tasks[2])
    _looks(run, 2)
    assert run.state.preemptions == 0 and run.state.mode is Mode.SPOT
    assert len(_launches(fake_sky)) == 1
    for task in tasks[1:]:
        fake_sky.set_status(job, S.RECOVERING, task=task)
    _looks(run, 1)
    assert run.state.preemptions == 1


def _up_deadline(
    monkeypatch: pytest.MonkeyPatch,
    script: Path,  # noqa: F811
    tmp_path: Path,
    *extra: str,
    endpoint: str = "https://sky.example.com",
) -> Any:
    """`mncloud up --deadline` of run llm from the laptop (its own MNCLOUD_HOME)."""
    from mncloud.cli import app

    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", endpoint)
    monkeypatch.chdir(script.parent)
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
    args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "4", "--name", "llm", "--yes",
            "--bucket", f"file://{tmp_path / 'bucket'}", "--deadline", "4h", "--hours", "2",
            "--spot-price", "10", "--on-demand-price", "30", *extra]  # fmt: skip
    return runner.invoke(app, args)


def test_a_second_controller_for_a_run_is_refused_and_replace_ends_the_first(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 5: `up --deadline --name llm` while llm's controller lives (here a
    controller VM, another API user, launched the training job): one line, exit 2, naming
    `mncloud status llm` and `--replace`; `--replace` cancels that controller and its
    training job before it launches the new controller."""
    from tests.fakesky import LAPTOP, User

    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (first,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(first, S.RUNNING)
    fake_sky.as_user(User("controller-vm", "c0417001"))
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm")
    Driver(state).tick()
    (training,) = _named(fake_sky, "llm")
    fake_sky.as_user(LAPTOP)

    again = _up_deadline(monkeypatch, script, tmp_path)
    assert again.exit_code == 2
    (line,) = again.stderr.strip().splitlines()
    assert "mncloud status llm" in line and "--replace" in line and str(first) in line
    assert fake_sky.live_jobs("llm-control") == [first] and "Traceback" not in again.output

    replaced = _up_deadline(monkeypatch, script, tmp_path, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert first not in fake_sky.live_jobs() and training not in fake_sky.live_jobs()
    (second,) = fake_sky.live_jobs("llm-control")
    assert second != first


def test_a_refused_up_deadline_leaves_no_phantom_pending_run(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 9: the controller's launch refused; the state says so (failed, why),
    so `status` shows no run PENDING forever."""
    from sky import exceptions as sx

    from mncloud.cli import app

    fake_sky.fail("jobs.launch", sx.ResourcesUnavailableError("no CPU VM in any region"))
    result = _up_deadline(monkeypatch, script, tmp_path)
    assert result.exit_code == 2 and "no CPU VM" in result.stderr
    state = control.load_state("llm", fresh=False)
    assert state.phase == "failed" and "controller was not launched" in state.detail
    shown = runner.invoke(app, ["status", "llm"])
    assert "pending" not in shown.output.lower(), shown.output


def test_down_from_another_laptop_finds_the_controller_and_its_training_job(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 7: `down llm` where nothing of the run was ever recorded (another
    laptop, a wiped home): SkyPilot's queue names llm-control, its envs the state in the
    bucket, the state the training job; both cancelled, and the same-named job of another run
    left alone."""
    from mncloud.cli import app

    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(controller, S.RUNNING)
    Driver(_fresh_vm(monkeypatch, tmp_path, "controller-vm")).tick()
    (training,) = _named(fake_sky, "llm")
    fake_sky.set_status(training, S.RUNNING)
    other = fake_sky.add_job("llm", S.RUNNING)  # another run of that name (no run id of ours)

    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "other-laptop"))
    result = runner.invoke(app, ["down", "llm", "--now"])
    assert result.exit_code == 0, result.output
    assert fake_sky.live_jobs() == [other]
    said = " ".join(result.stdout.split())
    assert f"controller job {controller}" in said and f"training job {training}" in said


def test_status_asks_skypilot_how_the_controller_is(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #43 point 9: SkyPilot marked the controller FAILED (its restarts spent); the
    laptop's `status` says so instead of the last state the controller wrote."""
    from mncloud.cli import app

    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    fake_sky.set_status(controller, S.RUNNING)
    shown = runner.invoke(app, ["status", "llm"])
    assert "nothing steers" not in shown.output
    fake_sky.set_status(controller, S.FAILED, reason="exit 1 after 5 restarts")
    shown = runner.invoke(app, ["status", "llm"])
    said = " ".join(shown.output.split())
    assert f"managed job {controller}) is FAILED: nothing steers the run" in said, said
    assert control.load_state("llm", fresh=False).phase == "failed"


def test_a_spot_job_skypilot_recovered_bills_again(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """Issue #43 point 3: RECOVERING closes the spot job's segment where its VMs stopped;
    when SkyPilot's own recovery gets VMs, a segment opens again at the launch's price at
    SkyPilot's `last_recovered_at`, so 30 more minutes of 4 nodes running are billed (before:
    the cost stood still)."""
    from mncloud.records.ledger import cost_summary

    state = _state(script, tmp_path)
    # Slack enough to wait for spot: the policy does not switch to on-demand.
    state.config = state.config.model_copy(update={"deadline_s": 48 * 3600})
    control.save_state(state)
    run = Driver(state)
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 3)
    fake_sky.set_status(job, S.RECOVERING)
    _looks(run, 2)
    assert run.state.preemptions == 1 and run.state.mode is Mode.NONE
    (record,) = list_records("llm")
    waited = cost_summary(record, now=run.clock.now).total
    _looks(run, 2)
    assert cost_summary(list_records("llm")[0], now=run.clock.now).total == waited  # unbilled
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 1)
    assert run.state.mode is Mode.SPOT and len(_launches(fake_sky)) == 1
    (record,) = list_records("llm")
    lost = next(e.time for e in record.events if e.kind == "preemption")
    back = next(e for e in record.events if e.kind == "running" and e.time > lost)
    launch = next(e for e in record.events if e.kind == "launch")
    assert back.spot is True and back.hourly_price == launch.hourly_price > 0
    assert back.time == fake_sky.job(job).tasks[0].last_recovered_at
    later = run.clock.now + 1800.0
    billed = cost_summary(record, now=later).total - waited
    assert billed == pytest.approx(launch.hourly_price * (later - back.time) / 3600)
