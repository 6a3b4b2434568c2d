"""Elastic spot runs (`--min-nodes`): a run trains on the nodes spot capacity gives (at least
`--min-nodes`) instead of waiting for the whole gang, and grows back at the next checkpoint."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from mncloud.errors import SpecError
from tests.test_control import Cloud
from tests.test_skypilot import script  # noqa: F401 - a fixture


@pytest.mark.catalog
@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        (["--nodes", "4", "--min-nodes", "5"], "--min-nodes 5"),
        (["--nodes", "2", "--min-nodes", "0"], "--min-nodes 0"),
        (["--nodes", "2", "--min-nodes", "-1"], "--min-nodes -1"),
        (["--min-nodes", "2"], "--min-nodes 2"),  # --nodes defaults to 1
        (["--nodes", "2", "--min-nodes", "1"], "--min-nodes is kept by the run's controller"),
    ],
)
def test_bad_min_nodes_is_one_line_and_launches_nothing(flags: list[str], shown: str) -> None:
    from mncloud.cli import app
    from tests.test_local import runner, state_of

    example = "examples/train_ddp.py"
    args = ["up", example, "--cloud", "local", "--gpus", "cpu:2", "--name", "bad-min", *flags]
    result = runner.invoke(app, [*args, "--yes", "--detach"])
    assert result.exit_code == 2, result.output
    assert shown in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(Exception):  # noqa: B017 - no run was recorded under the name
        state_of("bad-min")


def test_min_nodes_above_nodes_is_refused_by_the_spec_too(tmp_path: Path) -> None:
    from mncloud.request import build_spec

    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    spec = build_spec(train, gpus="cpu:1", nodes=4, min_nodes=2, cloud="local")
    assert spec.min_nodes == 2
    with pytest.raises(ValueError, match="--min-nodes 3: give a whole number"):
        spec.updated(nodes=2, min_nodes=3)
    with pytest.raises(SpecError, match="--min-nodes 0"):
        build_spec(train, gpus="cpu:1", nodes=4, min_nodes=0, cloud="local")


# --------------------------------------------------------------------------- slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_fsdp.py"


def _committed_steps(folder: Path, launches: list[str]) -> dict[int, dict[str, Any]]:
    """Step → what trained it for good: a step trained again after a preemption counts from
    the later launch (it resumed from a checkpoint before it), read from every rank's log."""
    by_launch: dict[int, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for f in folder.glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            record = json.loads(line)
            seen = by_launch[record["step"]].setdefault(
                record["run"], {"world": record["world"], "ids": []}
            )
            seen["ids"] += record["ids"]
    return {step: runs[max(runs, key=launches.index)] for step, runs in by_launch.items()}


@pytest.mark.slow
@pytest.mark.catalog
def test_elastic_run_shrinks_to_the_offered_nodes_and_grows_back(tmp_path: Path) -> None:
    """`--nodes 2 --min-nodes 1`: spot offers 2 nodes, then 1 for a while, then 2 again. The
    run goes on on 1 node from its newest checkpoint, grows back to 2 at a checkpoint, and
    finishes with every sample once per epoch and the same global batch in every step."""
    from mncloud import control
    from mncloud.backends.local.figures import read_final
    from mncloud.cli import app
    from mncloud.layout import local_ckpt_dir
    from tests.test_local import run_log, runner, wait_until

    trace = tmp_path / "trace.json"  # a tick is 60 s of run time, 2 s of wall time
    trace.write_text(
        json.dumps({"metadata": {"gap_seconds": 60}, "data": [2] * 6 + [1] * 15 + [2]})
    )
    samples = tmp_path / "samples"
    # 10 steps an epoch, 1 s of slept compute a step on 2 nodes, 2 s on 1: at most 6 + 15
    # steps fit before the trace offers 2 again (12 s on 2, 30 s on 1), the rest run on 2.
    steps, batch = 40, 8
    train = ["--steps", str(steps), "--global-batch", str(batch), "--micro-batch", "2",
             "--samples", "80", "--ckpt-interval", "5", "--compute-ms", "500", "--log-every", "20",
             "--parallel", "ddp", "--sample-log", str(samples)]  # fmt: skip
    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", "stretch", "--yes", "--nodes",
            "2", "--min-nodes", "1", "--gpus", "cpu:1", "--recovery", "gang", "--spot-trace",
            str(trace), "--time-scale", "30", "--", *train]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    state = wait_until(
        lambda: (s := control.load_state("stretch")).final and s, 900, "the elastic run"
    )
    assert isinstance(state, control.ControlState)
    assert state.phase == "finished", (state.detail, run_log("stretch"))
    final = read_final(f"file://{local_ckpt_dir('stretch')}")
    assert final is not None and final["steps"] == steps

    trained = _committed_steps(samples, state.run_ids)
    assert sorted(trained) == list(range(1, steps + 1))
    worlds = [trained[step]["world"] for step in sorted(trained)]
    # Trained on 1 node (it grows only at a checkpoint of its own), then on 2 to the end (at
    # most 21 of the 40 steps are done when the trace offers 2 again).
    assert 1 in worlds and worlds[-1] == 2, worlds
    assert all(len(trained[s]["ids"]) == batch for s in trained)  # the same global batch
    for epoch in range(steps // 10):
        ids = [i for step in range(10 * epoch + 1, 10 * epoch + 11) for i in trained[step]["ids"]]
        assert sorted(ids) == list(range(80)), f"epoch {epoch}"
    launches = [d.reason for d in state.decisions if d.chose.value == "spot"]
    assert state.preemptions >= 1 and len(state.run_ids) >= 3, (state.run_ids, launches)


class ElasticCloud(Cloud):
    """`test_control`'s model of the cloud, where spot jobs get their VMs while their nodes fit
    in `spot_nodes`; every launch is checked to find no other job of the run still live (a
    size change cancels before it launches)."""

    def __init__(self, spot_nodes: int) -> None:
        super().__init__()
        self.spot_nodes = spot_nodes
        self.nodes: dict[int, int] = {}

    def capacity(self, job_id: int) -> bool:
        return self.nodes[job_id] <= self.spot_nodes

    def answer(self, name: str, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Any:
        if name == "jobs.launch":
            live = [j for j, s in self.jobs.items() if s in ("PENDING", "RUNNING", "RECOVERING")]
            assert not live, f"a launch while job(s) {live} live"
            self.nodes[7 + len(self.jobs)] = calls[-1][1][0].num_nodes
        return super().answer(name, calls)


@pytest.mark.catalog
def test_on_a_cloud_each_size_change_relaunches_the_job_never_two_live(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: Any,
    tmp_path: Path,
) -> None:
    """`--nodes 4 --min-nodes 2` where spot fits 2 nodes: the 4-node job waits 15 min for VMs,
    is cancelled and launched on 3, then on 2, which runs; once spot fits 4 again and the
    2-node job has run an hour, the next checkpoint relaunches it on 4."""
    from mncloud import control
    from mncloud.control.loop import Controller
    from mncloud.control.markets import ManagedJobMarket
    from mncloud.deadline.policy import Mode
    from mncloud.records.store import list_records
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions
    from mncloud.storage import CheckpointStore
    from mncloud.storage.checkpoints import Manifest
    from tests.test_control import FakeClock
    from tests.ticking import ticker

    cloud = ElasticCloud(spot_nodes=2)

    class Answers(dict[str, Any]):
        def get(self, name: str, default: Any = None) -> Any:
            return cloud.answer(name, fake_sky.calls)

    fake_sky.answers = Answers()
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(script, gpus="H100:8", nodes=4, min_nodes=2, name="llm", bucket=bucket)
    state = control.deadline_state(
        spec, LaunchOptions(hours=20, recovery_minutes=10), deadline_s=200 * 3600,
        hours_given=True, spot_price=10.0, on_demand_price=30.0,
    )  # fmt: skip
    assert state.config.min_nodes == 2
    clock = FakeClock()
    cloud.clock = clock
    ctl = Controller(state, ManagedJobMarket(), clock=clock)
    state.started_at = clock.now

    tick = ticker(ctl, state, clock)

    def launched() -> list[int]:
        return [args[0].num_nodes for args, _kw in fake_sky.called("jobs.launch")]

    tick()
    assert launched() == [4] and state.market is Mode.SPOT
    tick(4)  # 15 min without VMs: one node fewer, then again
    tick(4)
    assert launched() == [4, 3, 2], launched()
    assert cloud.jobs == {7: "CANCELLED", 8: "CANCELLED", 9: "RUNNING"}
    assert state.nodes_live == 2 and state.mode is Mode.SPOT
    spot_job = fake_sky.called("jobs.launch")[-1][0][0]
    assert spot_job.envs["MNCLOUD_CKPT_URI"] == f"{bucket}/llm"  # the same checkpoints

    cloud.spot_nodes = 4
    store = CheckpointStore(f"{bucket}/llm")
    store.commit(Manifest(step=100, world_size=16, files={}))
    tick(13)  # an hour on 2 nodes: all 4 are tried again, at the next checkpoint
    assert launched() == [4, 3, 2], "no growth before a checkpoint past the one it saw"
    store.commit(Manifest(step=200, world_size=16, files={}))
    tick()
    assert launched() == [4, 3, 2, 4] and cloud.jobs[9] == "CANCELLED"
    tick(2)
    assert cloud.jobs[10] == "RUNNING" and state.nodes_live == 4
    launches = [e for r in list_records("llm") for e in r.events if e.kind == "launch"]
    assert any("on the 2 of 4 nodes spot offers" in e.detail for e in launches)


def test_a_smaller_world_is_priced_against_waiting_for_the_gang(tmp_path: Path) -> None:
    """Training on k < N nodes pays when the wait for all N is expected to outlast its two
    extra launches: w > o·(1 + N/k); the expected wait is the mean of the shortfalls seen."""
    from mncloud import control
    from mncloud.deadline.policy import (
        Job,
        expected_gang_wait,
        smaller_world_breakeven,
        smaller_world_pays,
    )
    from mncloud.plan.traces import Trace
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions

    job = Job.build(nodes=4, hours=10, deadline_s=30 * 3600, overhead_s=600, gap_s=300,
                    spot_price=1.0, on_demand_price=3.0)  # fmt: skip
    assert job.overhead_ticks == 2
    assert smaller_world_breakeven(job, 2) == 6 and smaller_world_breakeven(job, 1) == 10
    assert expected_gang_wait([4, 4, 2], 4) == float("inf")  # no shortfall ended yet
    assert expected_gang_wait([4, 2, 2, 4, 3, 3, 3, 3, 4, 2], 4) == 2  # mean 3, 1 tick in
    assert smaller_world_pays(job, 2, [4, 2])  # a first shortfall: the gang may not come back
    short = [4, 2, 2, 4, 2, 2, 4, 2]  # shortfalls of 2 ticks: waiting is cheaper
    assert not smaller_world_pays(job, 2, short)
    eight = [4] + [2] * 8 + [4, 2]  # shortfalls of 8 ticks: 7 expected still, 1 tick in
    assert smaller_world_pays(job, 2, eight)  # 7 > 6: half the gang trains meanwhile
    assert not smaller_world_pays(job, 1, [min(c, 1) if c < 4 else c for c in eight])  # 7 < 10

    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    spec = build_spec(train, gpus="cpu:1", nodes=4, min_nodes=2, cloud="local", name="el")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": short}))
    state = control.deadline_state(
        spec, LaunchOptions(hours=10, recovery_minutes=10), deadline_s=30 * 3600,
        hours_given=True, spot_trace=trace,
    )  # fmt: skip
    market = control.TraceMarket(Trace.model_validate_json(trace.read_text()), 4, 2)
    seen = [market.spot_at(state, t, None, 0.0) for t in range(len(short))]
    assert seen == [True, True, True, True, False, False, True, False]  # waits once it knows
