"""The deadline controller on SkyPilot, offline: restarted anywhere it never launches twice,
every way a launch ends has its answer, and `down` leaves nothing of the run live.

SkyPilot's SDK calls are answered by a small managed-jobs table (`Sky`): each faked call is
bound to the real function's signature, `sky.jobs.launch` runs the SDK's own client-side DAG
conversion and YAML dump (what the queue later shows as `user_yaml`), and a job's state is
scripted by the test. Everything else is real: plan, render, launch, run records in a file://
bucket, the controller on a fake clock.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import control, layout
from mncloud.backends.skypilot.meta import load_meta
from mncloud.control.loop import Controller
from mncloud.control.markets import ManagedJobMarket
from mncloud.control.outcomes import MAX_RELAUNCHES, VANISHED_LOOKS
from mncloud.control.recovery import LaunchUnknown
from mncloud.deadline.policy import Mode
from mncloud.records import list_records
from mncloud.request import build_spec
from mncloud.spec import LaunchOptions
from tests.test_control import GAP, FakeClock
from tests.test_skypilot import DATA, script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
runner = CliRunner()


class Crash(BaseException):
    """The controller dies here (a kill: nothing catches it)."""


class Sky:
    """SkyPilot's API server as a table of managed jobs (and on-demand clusters)."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        self.clusters: dict[str, str] = {}
        self.results: dict[str, Any] = {}
        self.in_flight: dict[str, Any] = {}
        """Launch requests the server has not finished: request id → (body, the job)."""
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.hold_launches = False

    # ------------------------------------------------------------------ the table
    def add_job(self, name: str, yaml_text: str, tasks: list[str], status: str) -> int:
        job_id = max(self.jobs, default=0) + 1
        self.jobs[job_id] = {"name": name, "yaml": yaml_text, "tasks": tasks, "status": status}
        return job_id

    def status(self, job_id: int) -> str:
        return self.jobs[job_id]["status"]

    def set(self, job_id: int, status: str) -> None:
        self.jobs[job_id]["status"] = status

    def named(self, name: str) -> list[int]:
        return [i for i, job in self.jobs.items() if job["name"] == name]

    def launches(self) -> list[dict[str, Any]]:
        return [kw for n, kw in self.calls if n in ("jobs.launch", "launch")]

    # --------------------------------------------------------------- the SDK calls
    def _request(self, value: Any) -> str:
        request_id = f"req-{len(self.results) + 1}"
        self.results[request_id] = value
        return request_id

    def jobs_launch(self, task: Any, name: str | None, **_: Any) -> str:
        from sky.utils import dag_utils

        dag = dag_utils.convert_entrypoint_to_dag(task)
        yaml_text = dag_utils.dump_dag_to_yaml_str(dag)
        tasks = [str(t.name) for t in dag.tasks]
        job = (name or dag.name, yaml_text, tasks, "PENDING")
        if self.hold_launches:  # the server finishes it later, whoever waits for it
            request_id = self._request(None)
            self.in_flight[request_id] = (json.dumps({"task": yaml_text, "name": name}), job)
            return request_id
        return self._request(([self.add_job(*job)], None))

    def launch(self, task: Any, cluster_name: str | None = None, **_: Any) -> str:
        assert cluster_name is not None
        self.clusters[cluster_name] = "RUNNING"
        return self._request((1, None))

    def down(self, cluster_name: str, **_: Any) -> str:
        self.clusters.pop(cluster_name, None)
        return self._request(None)

    def sky_status(self, cluster_names: list[str] | None = None, **_: Any) -> str:
        from sky.schemas.api import responses

        raw = json.loads((DATA / "status_cluster_up.json").read_text())
        up = [n for n in cluster_names or [] if n in self.clusters]
        records = [responses.StatusResponse.model_validate(raw[0] | {"name": n}) for n in up]
        return self._request(records)

    def job_status(self, cluster_name: str, job_ids: list[int] | None = None, **_: Any) -> str:
        from sky.skylet import job_lib

        state = job_lib.JobStatus(self.clusters[cluster_name])
        return self._request({1: state})

    def queue_v2(
        self, job_ids: list[int] | None = None, name_match: str | None = None, **_: Any
    ) -> str:
        from sky.schemas.api import responses

        records = []
        for job_id, job in sorted(self.jobs.items()):
            if job_ids is not None and job_id not in job_ids:
                continue
            if name_match is not None and name_match not in job["name"]:
                continue
            for task_id, task in enumerate(job["tasks"]):
                records.append(responses.ManagedJobRecord.model_validate({
                    "job_id": job_id, "task_id": task_id, "job_name": job["name"],
                    "task_name": task, "status": job["status"], "user_yaml": job["yaml"],
                    "cloud": "AWS", "region": "us-east-1", "recovery_count": 0,
                }))  # fmt: skip
        return self._request((records, len(records), {}, len(records)))

    def cancel(self, name: str | None = None, job_ids: list[int] | None = None, **_: Any) -> str:
        from sky.jobs.state import ManagedJobStatus

        ids = list(job_ids or [])
        if name is not None:  # as SkyPilot: two live jobs of one name → nothing cancelled
            live = [i for i in self.named(name) if not self._terminal(i)]
            ids += live if len(live) == 1 else []
        for job_id in ids:
            if job_id in self.jobs and not ManagedJobStatus(self.status(job_id)).is_terminal():
                self.set(job_id, "CANCELLED")
        return self._request(None)

    def _terminal(self, job_id: int) -> bool:
        from sky.jobs.state import ManagedJobStatus

        return ManagedJobStatus(self.status(job_id)).is_terminal()

    def api_status(self, all_status: bool = False, **_: Any) -> list[Any]:
        from sky.server.requests.payloads import RequestPayload

        fields = {"name": "jobs.launch", "entrypoint": "", "status": "RUNNING", "created_at": 0.0,
                  "user_id": "u", "return_value": "", "error": "", "pid": None,
                  "schedule_type": "long"}  # fmt: skip
        return [
            RequestPayload(request_id=request_id, request_body=body, **fields)
            for request_id, (body, _job) in self.in_flight.items()
        ]

    def get(self, request_id: str, **_: Any) -> Any:
        if request_id in self.in_flight:
            _body, job = self.in_flight.pop(request_id)
            self.results[request_id] = ([self.add_job(*job)], None)
        value = self.results[request_id]
        if isinstance(value, BaseException):
            raise value
        return value


@pytest.fixture
def sky_fake(monkeypatch: pytest.MonkeyPatch) -> Sky:
    """`Sky`, each call bound to the real SDK function's signature first."""
    import sky
    import sky.jobs

    fake = Sky()
    table = [
        (sky.jobs, "launch", "jobs_launch", "jobs.launch"),
        (sky.jobs, "queue_v2", "queue_v2", "jobs.queue_v2"),
        (sky.jobs, "cancel", "cancel", "jobs.cancel"),
        (sky, "launch", "launch", "launch"),
        (sky, "down", "down", "down"),
        (sky, "status", "sky_status", "status"),
        (sky, "job_status", "job_status", "job_status"),
        (sky, "api_status", "api_status", "api_status"),
        (sky, "get", "get", "get"),
        (sky, "stream_and_get", "get", "stream_and_get"),
    ]
    for module, name, impl, label in table:
        signature = inspect.signature(getattr(module, name))

        def call(*args: Any, _impl: str = impl, _sig: Any = signature, _label: str = label,
                 **kwargs: Any) -> Any:  # fmt: skip
            bound = _sig.bind(*args, **kwargs)
            bound.apply_defaults()
            fake.calls.append((_label, dict(bound.arguments)))
            return getattr(fake, _impl)(**bound.arguments)

        monkeypatch.setattr(module, name, call)
    return fake


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
        self.clock = clock or FakeClock()
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


def test_a_controller_restarted_with_a_fresh_home_refinds_job_n_and_launches_nothing(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = Driver(_state(script, tmp_path))
    first.tick()
    (job,) = sky_fake.named("llm")
    assert first.state.live is not None and first.state.live.job_ids == [job]
    sky_fake.set(job, "RUNNING")
    first.tick(3)
    launches = len(sky_fake.launches())

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    again.tick(3)
    assert len(sky_fake.launches()) == launches == 1
    meta = load_meta("llm")
    assert meta is not None and meta.job_id == job and meta.kind == "managed-job"
    assert [r.run_id for r in list_records("llm")] == state.run_ids  # the ledger is back
    assert state.market is Mode.SPOT and state.cost > 0
    sky_fake.set(job, "SUCCEEDED")
    again.tick()
    assert state.phase == "finished"


def test_a_launch_made_but_not_recorded_is_found_by_its_run_id_not_its_name(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mncloud.launch import launch

    decoy = sky_fake.add_job("llm", "envs:\n  MNCLOUD_RUN_ID: llm-other\n", ["llm"], "RUNNING")

    def launched_then_crash(*args: Any, **kw: Any) -> Any:
        launch(*args, **kw)
        raise Crash  # the job is made; the controller dies before it writes it down

    first = Driver(_state(script, tmp_path), launcher=launched_then_crash)
    with pytest.raises(Crash):
        first.tick()
    made = [i for i in sky_fake.named("llm") if i != decoy]
    assert len(made) == 1 and first.state.live is None
    pending = control.load_uri(first.state.config.state_uri or "")
    assert pending is not None and pending.launching is not None

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    again = Driver(state, first.clock)
    again.ctl._recover()
    assert state.launching is None and state.live is not None
    assert state.live.job_ids == made and state.live.run_id == pending.launching.run_id
    assert len(sky_fake.launches()) == 1
    again.tick(2)
    assert len(sky_fake.launches()) == 1 and sky_fake.status(decoy) == "RUNNING"


def test_a_launch_still_in_flight_when_the_controller_died_is_waited_for_and_adopted(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client died after sending the request; the API server made the job later."""
    import sky

    def sent_then_crash(*args: Any, **kw: Any) -> Any:
        from mncloud.launch import launch

        monkeypatch.setattr(sky, "stream_and_get", lambda *_a, **_k: (_ for _ in ()).throw(Crash))
        launch(*args, **kw)

    sky_fake.hold_launches = True
    first = Driver(_state(script, tmp_path), launcher=sent_then_crash)
    with pytest.raises(Crash):
        first.tick()
    assert sky_fake.named("llm") == [] and len(sky_fake.in_flight) == 1
    sky_fake.hold_launches = False

    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    Driver(state, first.clock).ctl._recover()
    (job,) = sky_fake.named("llm")
    assert state.live is not None and state.live.job_ids == [job]
    assert len(sky_fake.launches()) == 1


def test_a_journaled_launch_never_made_is_made_once_with_its_run_id(
    script: Path,  # noqa: F811
    sky_fake: Sky,
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
    with monkeypatch.context() as down:
        down.setattr(sky_fake, "api_status", _unreachable)
        down.setattr(first.clock, "sleep", _unreachable)  # `run` must not get to its loop
        with pytest.raises(LaunchUnknown, match="API server is unreachable"):
            Driver(state, first.clock).ctl.run()
    assert sky_fake.launches() == [] and state.launching is not None
    Driver(state, first.clock).ctl._recover()
    assert len(sky_fake.named("llm")) == len(sky_fake.launches()) == 1
    assert state.live is not None and state.live.run_id == journaled.launching.run_id
    assert state.run_ids == [journaled.launching.run_id]


def _unreachable(*_args: Any, **_kw: Any) -> Any:
    from sky import exceptions as sx

    raise sx.ApiServerConnectionError("https://sky.example.com")


# ---------------------------------------------------------------- how a launch ends


def test_no_spot_capacity_goes_on_demand_at_once(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path))
    run.tick()
    (job,) = sky_fake.named("llm")
    assert run.state.market is Mode.SPOT
    sky_fake.set(job, "FAILED_NO_RESOURCE")
    run.tick(gap=1)  # the same tick, decided again
    assert run.state.market is Mode.ON_DEMAND and run.state.phase == "on-demand"
    assert run.state.spot_missing_since is not None and run.state.preemptions == 0
    assert len(sky_fake.launches()) == 2 and run.state.switches == 1
    events = [e.kind for r in list_records("llm") for e in r.events]
    assert events[:3] == ["launch", "failure", "launch"]  # the failed spot job billed no more


def test_user_errors_are_retried_up_to_max_restarts_then_the_run_fails_with_the_count(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path, max_restarts=2))
    run.tick()
    for attempt in range(3):
        job = sky_fake.named("llm")[-1]
        assert len(sky_fake.named("llm")) == attempt + 1
        sky_fake.set(job, "FAILED")
        run.tick(gap=1)
    assert run.state.phase == "failed" and run.state.errors_retried == 2
    assert "retried 2 of --max-restarts 2 times" in run.state.detail
    assert len(sky_fake.launches()) == 3
    # Each launch the controller makes retries nothing itself: the controller counts.
    for _name, kwargs in (c for c in sky_fake.calls if c[0] == "jobs.launch"):
        recovery = [r.job_recovery for r in kwargs["task"].resources]
        assert recovery and all(r["max_restarts_on_errors"] == 0 for r in recovery)


def test_skypilots_own_failures_are_relaunched_uncounted_and_bounded(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path, max_restarts=0))
    run.tick()
    for _ in range(MAX_RELAUNCHES):
        sky_fake.set(sky_fake.named("llm")[-1], "FAILED_CONTROLLER")
        run.tick(gap=1)
        assert run.state.phase != "failed"
    assert run.state.errors_retried == 0 and len(sky_fake.launches()) == MAX_RELAUNCHES + 1
    sky_fake.set(sky_fake.named("llm")[-1], "FAILED_CONTROLLER")
    run.tick(gap=1)
    assert run.state.phase == "failed" and "SkyPilot lost the launch" in run.state.detail


def test_a_job_gone_from_the_queue_is_lost_only_after_several_looks(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
) -> None:
    run = Driver(_state(script, tmp_path))
    run.tick()
    (job,) = sky_fake.named("llm")
    sky_fake.jobs.pop(job)
    for _ in range(VANISHED_LOOKS - 1):
        run.tick(gap=1)
        assert run.state.market is Mode.SPOT and len(sky_fake.launches()) == 1
    run.tick(gap=1)
    assert len(sky_fake.launches()) == 2 and run.state.relaunches == 1


@pytest.mark.parametrize(
    ("status", "phase", "words"),
    [
        ("CANCELLED", "stopped", "cancelled outside the controller"),
        ("CANCELLING", "stopped", "cancelled outside the controller"),
        ("FAILED_PRECHECKS", "failed", "SkyPilot refused the launch"),
    ],
)
def test_ends_that_stop_the_run(
    script: Path,  # noqa: F811
    sky_fake: Sky,
    tmp_path: Path,
    status: str,
    phase: str,
    words: str,
) -> None:
    run = Driver(_state(script, tmp_path))
    run.tick()
    sky_fake.set(sky_fake.named("llm")[-1], status)
    run.tick(3)
    assert run.state.phase == phase and words in run.state.detail
    assert len(sky_fake.launches()) == 1


# --------------------------------------------------------------------------------- down


def test_up_deadline_then_down_cancels_the_controller_and_the_training_job(
    script: Path,  # noqa: F811
    sky_fake: Sky,
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
    (controller,) = sky_fake.named("llm-control")
    other = sky_fake.add_job("llm", "envs:\n  MNCLOUD_RUN_ID: llm-x\n", ["llm"], "RUNNING")

    # The controller, on its own VM, launches the training job.
    state = _fresh_vm(monkeypatch, tmp_path, "controller-vm")
    vm = Driver(state)
    vm.tick()
    (training,) = [i for i in sky_fake.named("llm") if i != other]
    sky_fake.set(controller, "RUNNING")
    sky_fake.set(training, "RUNNING")

    monkeypatch.setenv("MNCLOUD_HOME", str(laptop))  # back on the laptop: no record of it
    result = runner.invoke(app, ["down", "llm", "--now"])
    assert result.exit_code == 0, result.output
    assert sky_fake.status(controller) == sky_fake.status(training) == "CANCELLED"
    assert sky_fake.status(other) == "RUNNING"  # same name, another run: untouched
    said = " ".join(result.stdout.split())
    assert f"cancelled controller job {controller} and training job {training}" in said
    assert all(kw["name"] is None for n, kw in sky_fake.calls if n == "jobs.cancel")
    final = control.load_uri(state.config.state_uri or "")
    assert final is not None and final.phase == "stopped"

    again = runner.invoke(app, ["down", "llm", "--now"])
    assert again.exit_code == 0, again.output
    assert "nothing of the run was live" in " ".join(again.stdout.split())


def test_down_finds_a_training_job_the_state_only_journaled(
    script: Path,  # noqa: F811
    sky_fake: Sky,
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
    (training,) = sky_fake.named("llm")
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
    laptop = control.load_uri(state.config.state_uri or "")
    assert laptop is not None and laptop.job_ids == []
    control.save_state(laptop)

    from mncloud.operate import stop_run

    status = stop_run("llm")
    assert sky_fake.status(training) == "CANCELLED"
    assert f"cancelled training job {training}" in status.detail
