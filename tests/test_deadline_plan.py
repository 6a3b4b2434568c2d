"""`plan --deadline`: hazards and gaps from the traces, the availability model, the estimates,
the table, the JSON, the budget and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from mncloud.cli import plan as plan_cli
from mncloud.deadline import pricing as deadline
from mncloud.deadline.policy import POLICIES, Job, Mode, make_policy
from mncloud.deadline.replay import Result, replay
from mncloud.errors import SpecError
from mncloud.plan import hazards
from tests.test_plan_cli import _app  # `plan` alone, called the way users call it

TRACES = Path(__file__).parents[1].parent / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no spot traces at {TRACES}")
runner = CliRunner()
ARGS = ("--gpus", "H100:8", "--hours", "20", "--deadline", "30h")


def _run(*args: str, width: int = 200) -> tuple[int, str, str]:
    plan_cli.console = Console(width=width)
    result = runner.invoke(_app(), ["plan", *args], env={"COLUMNS": str(width)})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(autouse=True)
def _restore_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_cli, "console", plan_cli.console)


@needs_traces
def test_counts_gaps_and_default_are_what_the_traces_say() -> None:
    measured = hazards.hazards_from_files(sorted(TRACES.rglob("*.json")))
    rounded = {k: (p, round(h, 2)) for k, (p, h) in hazards.counts(measured).items()}
    assert rounded == hazards.TRACE_COUNTS
    by_region = hazards.counts(measured, by_region=True)
    assert {k: (p, round(h, 2)) for k, (p, h) in by_region.items()} == hazards.TRACE_REGION_COUNTS
    preemptions = sum(m.preemptions for m in measured)
    node_hours = sum(m.node_hours for m in measured)
    assert round((preemptions + 0.5) / node_hours, 3) == hazards.DEFAULT_HAZARD_PER_HOUR
    n_gaps, gap_hours = sum(m.gaps for m in measured), sum(m.gap_hours for m in measured)
    assert (n_gaps, round(gap_hours, 2)) == hazards.TRACE_GAPS
    assert round(gap_hours / n_gaps, 2) == hazards.MEAN_SPOT_GAP_HOURS


def test_gaps_leave_out_runs_cut_by_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 1800}, "data": [0, 4, 3, 0, 4, 4, 2]}))
    (item,) = hazards.hazards_from_files([path])
    assert (item.gaps, item.gap_hours) == (1, 1.0)  # ticks 2–3; the first and last are cut


def test_availability_is_seeded_and_has_the_models_means() -> None:
    model = deadline.Availability(job_hazard=2.0, mean_gap_hours=1.5)
    sample = model.sample(400, 2000, 60)
    assert np.array_equal(sample, model.sample(400, 2000, 60))
    assert sample.mean() == pytest.approx(0.5 / (0.5 + 1.5), abs=0.02)
    edges = np.diff(sample.astype(np.int8), axis=1)
    ups = (edges == 1).sum()
    assert sample[:, 1:].sum() / 60 / ups == pytest.approx(0.5, rel=0.1)  # mean up 1/Λ hours
    assert deadline.Availability(0.0).sample(3, 10, 300).all()


def test_policies_do_not_read_prices() -> None:
    """The estimator simulates hours once per hazard and prices them per place."""
    job = deadline.deadline_job(nodes=2, hours=10, deadline_s=16 * 3600, recovery_minutes=10)
    windows = deadline.Availability(1.0).sample(20, job.deadline_ticks, job.gap_seconds)
    dear = Job(**{**job.__dict__, "spot_price": 7.0, "on_demand_price": 9.0})
    for name in POLICIES:
        for row in windows:
            a, b = replay(make_policy(name, job), row), replay(make_policy(name, dear), row)
            assert (a.spot_hours, a.on_demand_hours, a.finished_hours) == (
                b.spot_hours,
                b.on_demand_hours,
                b.finished_hours,
            )


def test_spot_only_by_hand() -> None:
    job = Job(
        1, 300, work_ticks=4, deadline_ticks=8, overhead_ticks=1, spot_price=1, on_demand_price=3
    )
    # Runs of 3 (1 overhead + 2 work), then 4 (1 + the 2 left, done at tick 9 > 8).
    row = np.array([1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0], dtype=bool)
    assert deadline._spot_only(job, row) == (6, 8)
    assert deadline._spot_only(job, np.array([1, 1, 0, 0], dtype=bool)) == (2, 5)  # never done


def test_market_hours_meet_every_deadline() -> None:
    job = deadline.deadline_job(nodes=4, hours=20, deadline_s=30 * 3600, recovery_minutes=10)
    hours = deadline.market_hours(job, 4 * 0.257, "adaptive", windows=50)
    assert hours.met == 1.0
    assert hours.spot_hours + hours.on_demand_hours >= 20
    assert hours.finish_hours <= 30
    assert 0 <= hours.spot_only_met < 1
    assert deadline.tick_seconds(30 * 3600) == 300
    assert deadline.tick_seconds(10 * 24 * 3600) == 600  # at most MAX_TICKS ticks


@pytest.mark.slow
@pytest.mark.catalog
def test_estimates_per_place_and_the_budget() -> None:
    from mncloud.plan import PlanRequest, make_plan
    from mncloud.spec import Accelerator

    plan = make_plan(PlanRequest.build(accelerator=Accelerator.parse("H100:8"), hours=20))
    report = deadline.estimate_deadline(plan, 30 * 3600)
    assert report.slack_hours == pytest.approx(30 - 20 - 1 / 6)
    assert [p.expected_cost for p in report.places] == sorted(
        p.expected_cost for p in report.places
    )
    assert report.choice.is_at(plan.choice) and plan.choice.spot
    assert all(p.met == 1.0 for p in report.places)
    aws = report.choice  # aws us-east-1 spot $10.24, its own on-demand $55.04 per node-hour
    assert (aws.on_demand_where, aws.spot_per_node) == ("here", pytest.approx(10.2397))
    assert aws.on_demand_cost == pytest.approx((20 + 1 / 6) * 55.04, rel=1e-3)
    assert aws.spot_only_cost < aws.expected_cost < aws.on_demand_cost
    assert aws.expected_cost == pytest.approx(
        aws.spot_hours * 10.2397 + aws.on_demand_hours * aws.on_demand_per_node
    )
    lam = next(p for p in report.places if p.cloud == "lambda")
    assert lam.spot_per_node is None and lam.expected_cost == lam.on_demand_cost
    assert report.for_candidate(plan.choice) == aws
    assert report.over_budget() is None
    cheapest = report.cheapest.expected_cost
    warned = deadline.estimate_deadline(plan, 30 * 3600, budget=cheapest + 1)
    assert warned.over_budget() is not None and f"${cheapest:,.2f}" in warned.over_budget()
    with pytest.raises(SpecError, match=rf"below the least expected cost.*\${cheapest:,.2f}"):
        deadline.estimate_deadline(plan, 30 * 3600, budget=cheapest - 1)
    with pytest.raises(SpecError, match="not launched: the choice"):
        deadline.refuse_over_budget(plan, 30 * 3600, cheapest + 1)


@pytest.mark.slow
@pytest.mark.catalog
def test_deadline_table_reads_at_80_columns() -> None:
    code, out, err = _run(*ARGS, "--nodes", "4", "--budget", "3000", width=80)
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    table = out[out.index("By a 30 h deadline, adaptive policy") :]
    for words in (
        ("policy", "on-demand", "only $", "spot"),
        ("offer", "exp. $", "in time", "by h"),
    ):
        assert any(all(w in line for w in words) for line in table.splitlines()), words
    assert "lambda us-east-1 +16 regions" in table and "gpu_8x_h100_sxm5 on-demand" in table
    assert "slack 9.83 h" in table
    assert "warning: the choice, gcp a3-highgpu-8g in us-east4" in " ".join(table.split())


@pytest.mark.slow
@pytest.mark.catalog
def test_json_carries_the_deadline_figures_per_candidate() -> None:
    code, out, err = _run(*ARGS, "--json", "--top", "3")
    assert code == 0, err
    data = json.loads(out)
    figures = data["deadline"]
    assert (figures["policy"], figures["deadline_hours"], figures["windows"]) == (
        "adaptive",
        30,
        200,
    )
    assert figures["warning"] is None and figures["budget"] is None
    fields = ("expected_cost", "on_demand_cost", "spot_only_cost", "spot_only_met", "finish_hours")
    for c in [data["choice"], *data["candidates"]]:
        assert all(f in c["deadline"] for f in fields)
    assert data["choice"]["deadline"] == figures["choice"]
    again = json.loads(_run(*ARGS, "--json", "--top", "3")[1])
    assert again["deadline"] == figures  # a fixed seed: the same figures every time


@pytest.mark.slow
@pytest.mark.catalog
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--deadline", "20h"), "the earliest feasible deadline is 20.1667 h"),
        (("--deadline", "0h"), "--deadline '0h': it must be longer than 0"),
        (("--deadline", "soon"), "--deadline 'soon': write a duration"),
        (("--deadline", "-3h"), "--deadline '-3h': write a duration"),
        (("--deadline", "30h", "--budget", "0"), "--budget 0: it must be greater than 0"),
        (("--deadline", "30h", "--budget", "100"), "below the least expected cost by the 30 h"),
        (("--budget", "900"), "--budget needs --deadline"),
        (("--deadline", "30h", "--spot"), "drop --spot / --on-demand"),
        (("--hazards-from", "/nonexistent.json"), "trace /nonexistent.json: no such file"),
        (("--nodes", "4", "--min-nodes", "2"), "--min-nodes prices an elastic spot run by a"),
        (("--deadline", "30h", "--nodes", "4", "--min-nodes", "5"), "--min-nodes 5: give a whole"),
        (("--deadline", "30h", "--nodes", "4", "--min-nodes", "0"), "--min-nodes 0: give a whole"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    code, out, err = _run("--gpus", "H100:8", "--hours", "20", *args)
    assert code == 2, out
    assert out == ""
    assert err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_min_nodes_rides_a_gap_longer_than_the_controller_s_break_even() -> None:
    """The controller's rule (`smaller_world_breakeven`: o·(1 + N/k) ticks) over the model's
    mean gap: 4 nodes, 10 min launches (2 ticks of 5 min). On 2 nodes a gap must outlast
    6 ticks = 0.5 h; the mean gap (2.06 h) does, and on 2 of 4 nodes it trains (2.06 − 1/6)/2
    h of the 4-node work; on 1 node the break-even is 10 ticks; a 0.4 h mean gap pays for
    neither; --min-nodes equal to --nodes never rides."""
    job = deadline.deadline_job(nodes=4, hours=20, deadline_s=30 * 3600, recovery_minutes=10)
    two = deadline.elastic_ride(job, 2)
    assert two.breakeven_hours == pytest.approx(0.5) and two.pays
    assert two.work_hours_per_gap == pytest.approx((2.06 - 1 / 6) / 2)
    one = deadline.elastic_ride(job, 1)
    assert one.breakeven_hours == pytest.approx(10 / 12) and one.pays
    assert one.work_hours_per_gap == pytest.approx((2.06 - 1 / 6) / 4)
    short = deadline.elastic_ride(job, 2, mean_gap_hours=0.4)
    assert not short.pays and short.work_hours_per_gap == 0
    assert "the gang waits" in short.line()
    assert not deadline.elastic_ride(job, 4).pays
    with pytest.raises(SpecError, match="--min-nodes 5"):
        deadline.elastic_ride(job, 5)


def test_the_replay_rides_a_gap_on_min_nodes_as_the_controller_would() -> None:
    """4 nodes, 2 h of work (24 ticks), 2-tick launches; the gang's spot for 10 ticks, gone
    for 30, back. The gang waits the gap out: done at tick 10 + 30 + 2 + 16 = 58. On 2 nodes
    the gap (the first: without end, as far as anyone knows) is ridden: a launch (2 ticks),
    then half a tick's work a tick, 14 in all; back on 4 at tick 40, done at 44, billed 15
    gang-ticks more for the ride. A first gap of 2 ticks makes the next one not worth riding."""
    job = deadline.deadline_job(nodes=4, hours=2, deadline_s=10 * 3600, recovery_minutes=10)
    row = np.array([True] * 10 + [False] * 30 + [True] * 200)

    def run(available: np.ndarray, k: int | None) -> Result:
        return replay(make_policy(deadline.DEFAULT_POLICY, job), available, 0, min_nodes=k)

    gang, two = run(row, None), run(row, 2)
    assert gang.finished_hours == pytest.approx(job.hours(58)) and gang.idle_hours == job.hours(30)
    assert two.finished_hours == pytest.approx(job.hours(44)) and two.idle_hours == 0
    assert two.spot_hours == pytest.approx(job.hours(10 + 4) + job.hours(30) / 2)
    assert two.cost == pytest.approx(29 * job.tick_cost(Mode.SPOT))
    assert run(row, 4).to_json() == gang.to_json()  # --min-nodes = --nodes: the gang
    short_first = np.array([True] * 5 + [False] * 2 + [True] * 5 + [False] * 30 + [True] * 200)
    assert run(short_first, 2).idle_hours == job.hours(30)  # the 30-tick gap: waited out


@pytest.mark.slow
@pytest.mark.catalog
def test_plan_deadline_with_min_nodes_says_what_riding_a_gap_is_worth() -> None:
    code, out, err = _run(*ARGS, "--nodes", "4", "--min-nodes", "2", "--top", "1")
    assert code == 0, err
    said = " ".join(out.split())
    assert "--min-nodes 2: a shortfall of spot rides on 2 of 4 nodes" in said
    assert "it trains 0.95 h of the 4-node work the gang would wait out" in said
    code, out, err = _run(*ARGS, "--nodes", "4", "--min-nodes", "2", "--top", "1", "--json")
    assert code == 0, err
    elastic = json.loads(out)["deadline"]["elastic"]
    assert (elastic["min_nodes"], elastic["nodes"], elastic["pays"]) == (2, 4, True)
    gang = json.loads(_run(*ARGS, "--nodes", "4", "--top", "1", "--json")[1])["deadline"]
    assert gang["elastic"] is None
    ridden = json.loads(out)["deadline"]["choice"]  # gaps ridden on 2 nodes: less on-demand
    assert ridden["on_demand_hours"] < gang["choice"]["on_demand_hours"]
    assert ridden["expected_cost"] < gang["choice"]["expected_cost"]


@pytest.mark.catalog
def test_hazards_from_a_users_trace(tmp_path: Path) -> None:
    path = tmp_path / "calm.json"
    meta = {"gap_seconds": 3600, "cloud": "aws", "region": "us-east-1"}
    path.write_text(json.dumps({"metadata": meta, "data": [1] * 500}))  # 500 node-h, no preemption
    base = ("--gpus", "H100:8", "--hours", "20", "--spot", "--cloud", "aws")
    code, out, err = _run(*base, "--hazards-from", str(path), "--json")
    assert code == 0, err
    choice = json.loads(out)["choice"]
    assert choice["region"] == "us-east-1"
    assert choice["hazard_source"] == "your traces, aws us-east-1: 0 preemptions in 500.0 node-h"
    assert choice["preemption_rate"] == pytest.approx(0.6727 * 50 / 550, abs=1e-3)
    _, verbose, _ = _run(*base, "--hazards-from", str(path), "--verbose")
    assert f"your trace {path}: aws us-east-1, 0 preemptions in 500.0 node-h" in verbose
    assert "(your traces, aws us-east-1: 0 preemptions" in verbose
    pinned = json.loads(
        _run(*base, "--hazards-from", str(path), "--preemption-rate", "0.2", "--json")[1]
    )
    assert pinned["choice"]["hazard_source"] == "--preemption-rate"


@pytest.mark.catalog
def test_up_and_render_plan_use_hazards_from(tmp_path: Path) -> None:
    """`--hazards-from` is a planning option: `up` and `render --plan` plan with it too."""
    from mncloud.launch import prepare
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions

    path = tmp_path / "calm.json"
    meta = {"gap_seconds": 3600, "cloud": "aws", "region": "us-east-1"}
    path.write_text(json.dumps({"metadata": meta, "data": [1] * 500}))
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = build_spec(tmp_path / "train.py", gpus="H100:8", spot=True, cloud=["aws"])
    plan = prepare(spec, LaunchOptions(hours=20, hazards_from=(path,))).plan
    assert plan is not None
    assert plan.choice.hazard_source == "your traces, aws us-east-1: 0 preemptions in 500.0 node-h"
    plain = prepare(spec, LaunchOptions(hours=20)).plan
    assert plain is not None and not plain.choice.hazard_source.startswith("your traces")
    from mncloud.cli import app

    result = runner.invoke(app, [
        "render", str(tmp_path / "train.py"), "--gpus", "H100:8", "--spot", "--cloud", "aws",
        "--plan", "--hazards-from", str(tmp_path / "missing.json"),
    ])  # fmt: skip
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == f"error: trace {tmp_path}/missing.json: no such file"


@pytest.mark.slow
@pytest.mark.catalog
def test_a_choice_over_the_budget_is_refused(tmp_path: Path) -> None:
    from mncloud.launch import prepare
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = build_spec(tmp_path / "train.py", gpus="H100:8", nodes=1)
    options = LaunchOptions(hours=20)
    plan = prepare(spec, options).plan
    assert plan is not None
    report = deadline.estimate_deadline(plan, 30 * 3600)
    choice, cheapest = report.choice.expected_cost, report.cheapest.expected_cost
    assert cheapest < choice  # aws us-east-1 spot is the plan's choice, not the deadline's
    # What `up --deadline --budget` runs (mncloud.control.start) before anything starts.
    with pytest.raises(SpecError, match=r"not launched: the choice, aws p5\.48xlarge in us-east-1"):
        deadline.refuse_over_budget(plan, 30 * 3600, (cheapest + choice) / 2)
    with pytest.raises(SpecError, match="below the least expected cost"):
        deadline.refuse_over_budget(plan, 30 * 3600, cheapest - 1)
    assert deadline.refuse_over_budget(plan, 30 * 3600, choice + 1).choice.expected_cost == choice
