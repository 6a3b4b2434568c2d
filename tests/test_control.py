"""The deadline controller over SkyPilot, offline, and `up --deadline`'s bad input.

Only SkyPilot's API calls are replaced (tests/fakesky.py, its answers overridden): a small
model of the cloud answers them (spot capacity on or off, spot and on-demand managed jobs), the
SDK's own response models parse the answers, and the controller runs on a fake clock, so no
test waits on real time. Everything else is real: plan, render, run records, the ledger, the
checkpoint store on a file:// bucket, the policy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import control, layout
from mncloud.cli import app
from mncloud.control.loop import Controller
from mncloud.control.markets import ManagedJobMarket
from mncloud.deadline.policy import Mode
from mncloud.plan.traces import load_trace
from mncloud.records.ledger import cost_summary
from mncloud.records.store import find_record, list_records
from mncloud.request import build_spec
from mncloud.spec.launch import LaunchOptions
from tests.fakesky import FakeSky
from tests.test_skypilot import DATA, script  # noqa: F401 - a fixture

runner = CliRunner()
GAP = 300


class FakeClock:
    """Wall time that moves only when told (or when the controller sleeps)."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Cloud:
    """What SkyPilot's API server would answer, from a tiny model of the cloud: every launch
    a managed job (spot or on-demand); spot jobs run only while there is spot capacity."""

    def __init__(self) -> None:
        self.spot_capacity = False
        self.jobs: dict[int, str] = {}
        self.spot: dict[int, bool] = {}
        self.done = False
        self.clock: FakeClock | None = None
        """The test's clock: the queue's times (start_at, job_duration, ...) are on it."""
        self.times: dict[int, dict[str, Any]] = {}

    def capacity(self, job_id: int) -> bool:
        """Whether job `job_id` gets (keeps) its VMs now."""
        return self.spot_capacity or not self.spot[job_id]

    def _now(self) -> float:
        return self.clock.now if self.clock is not None else time.time()

    def _moved(self, job_id: int, status: str) -> str:
        """`job_id` goes to `status`; its VM times kept as SkyPilot's queue keeps them."""
        now, was = self._now(), self.jobs[job_id]
        times = self.times.setdefault(
            job_id, {"start_at": None, "last_recovered_at": -1, "ran_s": 0.0, "since": None,
                     "end_at": None},
        )  # fmt: skip
        if times["since"] is not None and status != "RUNNING":
            times["ran_s"] += now - times["since"]
            times["since"] = None
        if status == "RUNNING" and was != "RUNNING":
            times["start_at"] = times["start_at"] or now
            times["last_recovered_at"] = times["since"] = now
        if status in ("SUCCEEDED", "CANCELLED", "FAILED"):
            times["end_at"] = now
        self.jobs[job_id] = status
        return status

    def _times(self, job_id: int) -> dict[str, Any]:
        times = self.times.get(job_id) or {"start_at": None, "last_recovered_at": -1,
                                           "ran_s": 0.0, "since": None, "end_at": None}  # fmt: skip
        running = self._now() - times["since"] if times["since"] is not None else 0.0
        return {"start_at": times["start_at"], "last_recovered_at": times["last_recovered_at"],
                "job_duration": times["ran_s"] + running, "end_at": times["end_at"]}  # fmt: skip

    def answer(self, name: str, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Any:
        args, kwargs = calls[-1][1], calls[-1][2]
        if name == "jobs.launch":
            job_id = 7 + len(self.jobs)
            self.jobs[job_id] = "PENDING"
            self.spot[job_id] = any(r.use_spot for r in args[0].resources)
            return [job_id], None
        if name == "jobs.cancel":
            for job_id in kwargs.get("job_ids") or []:
                self._moved(job_id, "CANCELLED")
            return None
        if name == "jobs.queue_v2":
            return self._queue(kwargs.get("job_ids") or []), 1, {}, 1
        raise AssertionError(f"unexpected SkyPilot call {name}{args}")

    def _queue(self, job_ids: list[int]) -> list[Any]:
        from sky.schemas.api import responses

        found = []
        for job_id in job_ids:
            status = self.jobs[job_id]
            capacity = self.capacity(job_id)
            if status in ("PENDING", "RECOVERING") and capacity:
                status = self._moved(job_id, "RUNNING")
            if status == "RUNNING" and not capacity:
                status = self._moved(job_id, "RECOVERING")
            if status == "RUNNING" and self.done:
                status = self._moved(job_id, "SUCCEEDED")
            raw = json.loads((DATA / "jobs_queue_recovering.json").read_text())[0]
            raw.update(job_id=job_id, status=status, recovery_count=0, **self._times(job_id))
            found.append(responses.ManagedJobRecord.model_validate(raw))
        return found


@pytest.fixture
def cloud(fake_sky: FakeSky) -> Cloud:
    model = Cloud()

    class Answers(dict[str, Any]):
        def get(self, name: str, default: Any = None) -> Any:
            return model.answer(name, fake_sky.calls)

    fake_sky.answers = Answers()
    return model


@pytest.mark.slow
@pytest.mark.catalog
def test_spot_without_capacity_goes_on_demand_and_back_when_spot_returns(
    script: Path,  # noqa: F811 - the imported fixture
    cloud: Cloud,
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(script, gpus="H100:8", nodes=4, name="llm", bucket=bucket)
    options = LaunchOptions(hours=2, recovery_minutes=10)
    state = control.deadline_state(
        spec, options, deadline_s=4 * 3600, hours_given=True, spot_price=10.0,
        on_demand_price=30.0, policy="uniform-progress",
    )  # fmt: skip
    assert state.config.gap_s == GAP and state.config.state_uri is not None
    clock = FakeClock()
    cloud.clock = clock
    ctl = Controller(state, ManagedJobMarket(), clock=clock)
    state.started_at = clock.now
    modes: list[tuple[int, Mode]] = []

    def tick(n: int = 1) -> None:
        for _ in range(n):
            ctl.step()
            control.save_state(state)
            modes.append((state.last_tick, state.mode))
            clock.now += GAP

    tick()  # spot is worth a try: a managed spot job
    assert state.market is Mode.SPOT and len(fake_sky.called("jobs.launch")) == 1
    tick(2)  # pending, but not yet for capacity_wait_s (15 min)
    assert state.mode is Mode.SPOT and not fake_sky.called("jobs.cancel")
    tick()  # still pending after 15 min: no capacity; behind the uniform line → on-demand
    ((_args, kwargs),) = fake_sky.called("jobs.cancel")
    assert kwargs["job_ids"] == [7]
    (spot_task,), (on_demand_task,) = [args for args, _kw in fake_sky.called("jobs.launch")]
    assert state.market is Mode.ON_DEMAND and state.switches == 1
    assert all(not r.use_spot for r in on_demand_task.resources)  # a managed job too
    assert all(r.job_recovery["max_restarts_on_errors"] >= 0 for r in on_demand_task.resources)
    ckpt = f"{bucket}/llm"
    # The same task in the other market, resuming from the same checkpoints.
    assert on_demand_task.envs["MNCLOUD_CKPT_URI"] == spot_task.envs["MNCLOUD_CKPT_URI"] == ckpt

    cloud.spot_capacity = True  # spot returns; it is tried again an hour after it went missing
    tick(14)
    assert state.market is Mode.SPOT and state.switches == 2
    cancels = [kw["job_ids"] for _args, kw in fake_sky.called("jobs.cancel")]
    assert cancels == [[7], [8]] and len(fake_sky.called("jobs.launch")) == 3
    back = next(d for d in state.decisions if d.tick > 4 and d.chose is Mode.SPOT)
    assert back.tick == 15 and back.spot_now and "spot capacity is there" in back.reason
    # On on-demand until the policy was ahead of its line; maybe a wait; never spot before.
    seen = [m for _t, m in modes]
    first_od = seen.index(Mode.ON_DEMAND)
    assert Mode.SPOT not in seen[first_od:15] and seen[15] is Mode.SPOT
    tick(2)
    cloud.done = True
    tick()
    assert state.phase == "finished" and "met" in state.detail

    records = list_records("llm")
    assert [r.run_id for r in records] == state.run_ids and len(records) == 3
    summaries = [cost_summary(find_record(i), now=clock.now) for i in state.run_ids]
    # The first spot job waited for VMs it never got: nothing billed (#43: waiting is free).
    assert summaries[0].spot == 0 and summaries[1].on_demand > 0 and summaries[2].spot > 0
    assert state.spot_cost == pytest.approx(sum(s.spot for s in summaries), rel=1e-6)
    launches = [e for r in records for e in r.events if e.kind == "launch"]
    assert "switch to on-demand" in launches[1].detail and "slack" in launches[1].detail
    assert launches[1].hourly_price and launches[1].spot is False
    # `status` on the laptop reads the state the controller mirrors beside the checkpoints.
    mirrored = control.load_uri(layout.control_state_uri(ckpt))
    assert mirrored is not None and mirrored.phase == "finished"


def test_a_budget_the_first_tick_would_cross_launches_nothing(tmp_path: Path) -> None:
    """A fake backend (the local e2e test stops a real run at its budget)."""
    from mncloud.backends.base import RunState, RunStatus

    class Backend:
        name = "fake"
        runs_here = True  # as the local backend's: no API server to ask for earlier launches
        downs = 0

        def status(self, name: str) -> RunStatus:
            return RunStatus(name=name, backend="fake", state=RunState.RUNNING, nodes=2)

        def down(self, name: str, **notice: Any) -> RunStatus:
            Backend.downs += 1
            return RunStatus(name=name, backend="fake", state=RunState.CANCELLED, nodes=2)

    script_path = tmp_path / "train.py"
    script_path.write_text("pass\n")
    spec = build_spec(script_path, gpus="cpu:1", nodes=2, cloud=["local"], name="b")
    state = control.deadline_state(
        spec, LaunchOptions(hours=1, recovery_minutes=5), deadline_s=3 * 3600,
        hours_given=True, budget=1.0, spot_price=1.0, on_demand_price=3.0,
    )  # fmt: skip
    clock = FakeClock()
    market = control.TraceMarket(load_trace(_trace(tmp_path, [2] * 100)), 2)

    def launcher(spec: Any, options: Any, **_kw: Any) -> Any:
        from types import SimpleNamespace

        status = RunStatus(name="b", backend="fake", state=RunState.RUNNING, nodes=2)
        return SimpleNamespace(run_id=None, prepared=SimpleNamespace(plan=None), status=status)

    ctl = Controller(state, market, clock=clock, backend=Backend(), launcher=launcher)  # type: ignore[arg-type]
    state.spent_before = 0.95  # the name's earlier runs; no ledger here
    ctl.run()
    assert state.phase == "stopped" and "budget $1.00: $0.95 spent" in state.detail
    assert Backend.downs == 0 and state.run_ids == [] and state.market is Mode.NONE


def _trace(folder: Path, data: list[int], gap: int = 60) -> Path:
    path = folder / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


# ------------------------------------------------------------------------------ bad input


@pytest.fixture
def train(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return path


def _up(train: Path, *flags: str) -> Any:
    args = ["up", str(train), "--gpus", "cpu:1", "--nodes", "2", "--name", "dl", "--yes"]
    return runner.invoke(app, [*args, *flags])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--cloud", "local", "--deadline", "2h"], "--deadline needs --hours"),
        (["--cloud", "local", "--deadline", "2h", "--hours", "1", "--time-scale", "0"],
         "--time-scale 0: it must be greater than 0"),
        (["--cloud", "local", "--deadline", "2h", "--hours", "1", "--time-scale", "-3"],
         "--time-scale -3"),
        (["--cloud", "aws", "--deadline", "2h", "--hours", "1", "--spot-trace", "t.json"],
         "--spot-trace is for --cloud local"),
        (["--cloud", "local", "--deadline", "2h", "--hours", "1", "--spot-trace", "/no/t.json"],
         "no such file"),
        (["--cloud", "local", "--deadline", "1h", "--hours", "1"], "deadline 1 h is too short"),
        (["--cloud", "local", "--budget", "5"], "need --deadline"),
        (["--cloud", "local", "--deadline", "soon", "--hours", "1"], "--deadline 'soon'"),
        pytest.param(["--gpus", "H100:8", "--nodes", "4", "--deadline", "30h", "--hours", "20",
                      "--budget", "10", "--bucket", "s3://team-ckpt"],
                     "below the least expected cost", marks=pytest.mark.catalog),  # the policy's
    ],
)  # fmt: skip
def test_bad_deadline_input_is_one_line_and_exit_2(
    train: Path, flags: list[str], expected: str
) -> None:
    result = _up(train, *flags)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not layout.control_state_file("dl").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not JSON"),
        ('{"metadata": {}, "data": [1]}', "metadata.gap_seconds"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "data: "),
    ],
)
def test_malformed_trace_names_the_problem(
    train: Path, tmp_path: Path, content: str, expected: str
) -> None:
    trace = tmp_path / "bad.json"
    trace.write_text(content)
    flags = ["--cloud", "local", "--deadline", "2h", "--hours", "1", "--spot-trace", str(trace)]
    result = _up(train, *flags)
    assert result.exit_code == 2
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_budget_below_what_was_spent_is_refused(train: Path) -> None:
    from mncloud.records.store import append_event, create_record

    spec = build_spec(train, gpus="cpu:1", nodes=2, cloud=["local"], name="dl")
    create_record(spec, "a: 1\n", backend="local")
    t0 = time.time() - 3600
    append_event("dl", "launch", spot=False, hourly_price=20.0, at=t0)
    append_event("dl", "finish", at=t0 + 1800)  # $10 spent
    flags = ["--cloud", "local", "--deadline", "3h", "--hours", "1", "--budget", "5", "--resume"]
    result = _up(train, *flags)
    assert result.exit_code == 2
    assert "below what dl has already cost ($10.00)" in result.stderr


def test_dryrun_checks_the_deadline_request_and_starts_nothing(train: Path, tmp_path: Path) -> None:
    trace = _trace(tmp_path, [2, 2, 0, 2])
    flags = ["--cloud", "local", "--deadline", "2h", "--hours", "1", "--spot-trace", str(trace),
             "--time-scale", "60", "--dryrun"]  # fmt: skip
    result = _up(train, *flags)
    assert result.exit_code == 0, result.output
    assert "1 h of work by a 2 h deadline" in result.stdout and "no controller" in result.stdout
    assert not layout.control_state_file("dl").exists()
