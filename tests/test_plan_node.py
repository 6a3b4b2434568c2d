"""Node recovery in the planner: its cost model beside gang's, the plan it picks, what it shows.

The model's figures are checked against the worked example in `mncloud.plan.costmodel`'s docstring
and against an independent brute-force count of whole-gang failures; the plan tests run the real
catalog code over the snapshot and derive every expectation from the model.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from mncloud.cli import plan as plan_cli
from mncloud.errors import SpecError
from mncloud.plan import Plan, PlanRequest, costmodel, make_plan, recovery_note
from mncloud.request import build_spec
from mncloud.spec import Accelerator, Recovery, SpotPolicy, min_replicas
from tests.test_plan_cli import _app

R_10M = 10 / 60
C_60S = 60 / 3600
H_1M = costmodel.DEFAULT_HEAL_MINUTES / 60
#: AWS us-east-1's measured spot hazard (the issue's worked example): Λ = 4 · 0.673 ≈ 2.7/h.
US_EAST_1 = 0.673

runner = CliRunner()


# --- the model ---------------------------------------------------------------------------------


def _brute_force_gang_failure(nodes: int, hazard: float, window: float) -> float:
    """P(fewer than ceil(N/2) alive after a loss and the other nodes' fates within `window`)."""
    p = 1 - math.exp(-hazard * window)
    total = 0.0
    for fates in itertools.product((True, False), repeat=nodes - 1):
        lost = 1 + sum(fates)
        weight = math.prod(p if gone else 1 - p for gone in fates)
        if nodes - lost < min_replicas(nodes):
            total += weight
    return total


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 5, 8, 16])
def test_gang_failure_probability_counts_losses_past_half(nodes: int) -> None:
    for hazard in (0.01, US_EAST_1, 3.0):
        got = costmodel.gang_failure_probability(nodes, hazard, R_10M)
        assert got == pytest.approx(_brute_force_gang_failure(nodes, hazard, R_10M), rel=1e-9)
    p = -math.expm1(-US_EAST_1 * R_10M)
    if nodes == 1:
        assert costmodel.gang_failure_probability(1, US_EAST_1, R_10M) == 1.0  # no peer: gang
    if nodes == 2:
        assert costmodel.gang_failure_probability(2, US_EAST_1, R_10M) == pytest.approx(p)


def test_worked_example_of_the_docstring() -> None:
    """4 × H100:8 spot at 0.673/node-h, R = 10 min, C = 60 s, H = 1 min (costmodel docstring)."""
    gang = costmodel.estimate(1.0, 1.0, 4, US_EAST_1, R_10M, C_60S)
    node = costmodel.estimate_node(1.0, 1.0, 4, US_EAST_1, R_10M, C_60S, H_1M)
    assert gang.hours - 1 == pytest.approx(0.75, abs=0.005)  # the 75 %
    assert gang.interval_hours * 60 == pytest.approx(6.7, abs=0.05)  # Young–Daly τ ≈ 7 min
    assert not gang.viable and gang.loss_fraction >= costmodel.MAX_LOSS_FRACTION
    assert node.hours - 1 == pytest.approx(0.22, abs=0.005)  # 22 %, not the 17 %
    assert node.viable
    assert node.cost / gang.cost == pytest.approx(0.70, abs=0.005)
    # The same overhead, term by term from the docstring's formula.
    job = 4 * US_EAST_1
    p_g = _brute_force_gang_failure(4, US_EAST_1, R_10M)
    tau = node.interval_hours
    assert tau == pytest.approx(math.sqrt(2 * C_60S / (job * p_g)))
    by_hand = C_60S / tau + job * (1 - p_g) * (R_10M / 4 + H_1M) + job * p_g * (R_10M + tau / 2)
    assert node.hours - 1 == pytest.approx(by_hand)
    assert node.relaunches == pytest.approx(job * p_g * node.hours)
    assert node.preemptions == pytest.approx(job * node.hours)
    # The 17 % is this model without whole-gang failures, with hourly bucket checkpoints.
    assert C_60S / 1.0 + job * (R_10M / 4 + H_1M) == pytest.approx(0.17, abs=0.005)


@pytest.mark.parametrize("nodes", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("hazard", [0.01, 0.05, 0.257, 0.494, US_EAST_1, 1.0])
def test_node_recovery_costs_less_than_gang(nodes: int, hazard: float) -> None:
    gang = costmodel.estimate(40.0, 24, nodes, hazard, R_10M, C_60S)
    node = costmodel.estimate_node(40.0, 24, nodes, hazard, R_10M, C_60S, H_1M)
    assert node.hours < gang.hours and node.cost < gang.cost
    assert node.relaunches < gang.relaunches
    assert node.preemptions / node.hours == pytest.approx(gang.preemptions / gang.hours)


@pytest.mark.parametrize("nodes", [2, 4, 16])
def test_the_modes_agree_when_nodes_hardly_fail(nodes: int) -> None:
    """On-demand hazards: both are about the checkpoint cost at the 2 h clamp."""
    rate = costmodel.ON_DEMAND_HAZARD_PER_HOUR
    gang = costmodel.estimate(40.0, 24, nodes, rate, R_10M, C_60S)
    node = costmodel.estimate_node(40.0, 24, nodes, rate, R_10M, C_60S, H_1M)
    assert node.hours <= gang.hours
    assert node.hours == pytest.approx(gang.hours, rel=0.01)
    assert node.interval_hours == gang.interval_hours == costmodel.interval_bounds(C_60S)[1]


def test_one_node_under_node_recovery_is_gang_recovery() -> None:
    gang = costmodel.estimate(10.0, 24, 1, US_EAST_1, R_10M, C_60S)
    node = costmodel.estimate_with(Recovery.NODE, 10.0, 24, 1, US_EAST_1, R_10M, C_60S)
    assert node.hours == pytest.approx(gang.hours) and node.cost == pytest.approx(gang.cost)
    assert costmodel.estimate_with(Recovery.GANG, 10.0, 24, 1, US_EAST_1, R_10M, C_60S) == gang


# --- the plan ----------------------------------------------------------------------------------


def _request(recovery: Recovery, **fields: Any) -> PlanRequest:
    fields = {"nodes": 4, "hours": 24, "spot": SpotPolicy.SPOT, **fields}
    return PlanRequest.build(accelerator=Accelerator.parse("H100:8"), recovery=recovery, **fields)


def _place(c: Any) -> tuple[str, str, str, bool]:
    return (c.cloud, c.region, c.instance_type, c.spot)


def _us_east_1_spot(plan: Plan) -> list[Any]:
    return [c for c in plan.candidates if c.cloud == "aws" and c.region == "us-east-1"]


@pytest.mark.slow
@pytest.mark.catalog
def test_node_recovery_keeps_the_spot_offer_gang_excludes() -> None:
    gang, node = make_plan(_request(Recovery.GANG)), make_plan(_request(Recovery.NODE))
    # Gang: AWS us-east-1 spot would lose over half its time, so it is left out, and says why.
    assert not _us_east_1_spot(gang)
    reason = next(e.reason for e in gang.excluded if "spot in us-east-1" in e.reason)
    assert "--recovery node" in reason
    # Node: the same offer is in, priced by the node model, with gang's figures beside it.
    (offer,) = _us_east_1_spot(node)
    assert offer.recovery is Recovery.NODE
    assert not offer.by_recovery[Recovery.GANG].viable and offer.by_recovery[Recovery.NODE].viable
    assert offer.expected_cost == offer.by_recovery[Recovery.NODE].cost
    expected = costmodel.estimate_node(
        offer.hourly_total, 24, 4, offer.preemption_rate, R_10M, C_60S, H_1M
    )
    assert offer.expected_hours == pytest.approx(expected.hours)
    assert offer.checkpoint_interval_s == pytest.approx(expected.interval_hours * 3600)
    # Each plan ranks by its own mode, and names the other mode's choice: each other's.
    for plan, mode in ((gang, Recovery.GANG), (node, Recovery.NODE)):
        costs = [c.by_recovery[mode].cost for c in plan.candidates]
        assert costs == sorted(costs) and plan.choice.expected_cost == costs[0]
    assert node.other_choice is not None and gang.other_choice is not None
    assert _place(node.other_choice) == _place(gang.choice)
    assert _place(gang.other_choice) == _place(node.choice)
    # Whichever wins under node recovery, it is cheaper than anything gang recovery can pick.
    assert node.choice.expected_cost < gang.choice.expected_cost
    assert "gang recovery would choose" in node.explanation


@pytest.mark.catalog
def test_node_recovery_chooses_an_offer_gang_recovery_excludes() -> None:
    """Spot or on-demand, 4 × H100:8: node recovery's choice is an offer that gang recovery
    leaves out (the issue's AWS us-east-1 spot), and it is cheaper to finish than gang's."""
    gang = make_plan(_request(Recovery.GANG, spot=SpotPolicy.EITHER))
    node = make_plan(_request(Recovery.NODE, spot=SpotPolicy.EITHER))
    assert _place(node.choice) != _place(gang.choice)
    assert not node.choice.by_recovery[Recovery.GANG].viable
    assert _place(node.choice) not in {_place(c) for c in gang.candidates}
    assert node.choice.expected_cost < gang.choice.expected_cost
    assert f"{node.choice.market} {node.choice.where} wins" in node.explanation


@pytest.mark.catalog
def test_one_node_plan_carries_gang_only() -> None:
    plan = make_plan(_request(Recovery.GANG, nodes=1))
    assert all(set(c.by_recovery) == {Recovery.GANG} for c in plan.candidates)
    assert plan.other_choice is None
    with pytest.raises(SpecError, match="--recovery node needs --nodes 2"):
        _request(Recovery.NODE, nodes=1)


def _script(folder: Path, uses_replicas: bool) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "pyproject.toml").write_text("[project]\nname='p'\n")
    script = folder / "train.py"
    body = "replicas = Replicas(state)\n" if uses_replicas else "print('hi')\n"
    script.write_text("from mncloud.train import Replicas\n" + body)
    return script


@pytest.mark.catalog  # SkyPilot's GPU names
def test_the_request_takes_the_specs_recovery(tmp_path: Path) -> None:
    """Which mode a run gets is `mncloud.request`'s rule; the plan prices whatever it says."""
    opted, plain = _script(tmp_path / "a", True), _script(tmp_path / "b", False)
    node = build_spec(opted, gpus="H100:8", nodes=4, recovery="node")
    assert PlanRequest.from_spec(node).recovery is Recovery.NODE
    assert (
        PlanRequest.from_spec(build_spec(plain, gpus="H100:8", nodes=4)).recovery is Recovery.GANG
    )
    for cloud in (["aws"], ["kubernetes"]):
        spec = build_spec(opted, gpus="H100:8", nodes=4, cloud=cloud)
        assert PlanRequest.from_spec(spec).recovery is spec.recovery


@pytest.mark.catalog
def test_up_prices_the_runs_recovery_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mncloud.cli import app
    from mncloud.cli import up as up_cli

    seen: list[Plan] = []

    def stop(plan: Plan, *_args: object, **_kwargs: object) -> None:
        seen.append(plan)
        raise typer.Exit(code=3)

    monkeypatch.setattr(up_cli, "_show_and_confirm", stop)
    for name, opted in (("a", True), ("b", False)):
        script = str(_script(tmp_path / name, opted))
        args = ["up", script, "--gpus", "H100:8", "--nodes", "4", "--spot"]
        node = ["--recovery", "node", "--bucket", "s3://team-ckpt"]  # nodes find the lighthouse
        result = runner.invoke(app, args + (node if opted else []))
        assert result.exit_code == 3, result.output
    node, gang = seen
    assert (node.request.recovery, gang.request.recovery) == (Recovery.NODE, Recovery.GANG)
    assert node.choice == make_plan(node.request).choice
    assert node.choice.expected_cost < gang.choice.expected_cost


# --- the command -------------------------------------------------------------------------------


@pytest.fixture
def console80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_cli, "console", Console(width=80))


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(_app(), ["plan", *args], env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.catalog
@pytest.mark.usefixtures("console80")
def test_verbose_shows_gang_beside_node_and_why(tmp_path: Path) -> None:
    script = str(_script(tmp_path / "p", True))
    code, out, err = _run(
        script, "--recovery", "node", "--gpus", "H100:8", "--nodes", "4", "--spot", "--verbose"
    )
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    assert "4 × H100:8, 24 h of work, node recovery: cheapest first" in out
    assert "Gang or node recovery (this plan: node)" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[-1:] == ["relaunch"])
    assert lines[header - 1].split() == ["gang", "gang", "node", "node", "node"]
    assert lines[header].split() == [
        "offer",
        "hours",
        "cost",
        "$",
        "hours",
        "cost",
        "$",
        "relaunch",
    ]
    plan = make_plan(_request(Recovery.NODE))
    choice = plan.choice
    gang, node = choice.by_recovery[Recovery.GANG], choice.by_recovery[Recovery.NODE]
    row = next(
        line
        for line in lines[header:]
        if line.lstrip().startswith(f"{choice.cloud}/{choice.region}")
    )
    star = "" if gang.viable else "*"
    assert row.split()[1:] == [
        f"{gang.hours:,.1f}",
        f"{gang.cost:,.0f}{star}",
        f"{node.hours:,.1f}",
        f"{node.cost:,.0f}",
        f"{node.relaunches:.2f}",
    ]
    text = " ".join(out.split())
    assert plan.explanation in text  # which ends in what gang recovery would choose, and why
    assert recovery_note(plan) in plan.explanation and "gang recovery would choose" in text
    assert "recovery 10 min; checkpoint 60 s; heal 1 min" in text


@pytest.mark.catalog
@pytest.mark.usefixtures("console80")
def test_gang_plan_verbose_names_what_node_recovery_would_choose() -> None:
    code, out, err = _run("--gpus", "H100:8", "--nodes", "4", "--spot", "--verbose", "--top", "2")
    assert code == 0, err
    plan = make_plan(_request(Recovery.GANG))
    other = plan.other_choice
    assert other is not None
    text = " ".join(out.split())
    assert "Gang or node recovery (this plan: gang)" in text
    assert "--recovery node (for a script using mncloud.train.Replicas) would choose" in text
    assert f"{other.where} at ${other.by_recovery[Recovery.NODE].cost:,.2f}" in text
    if not other.by_recovery[Recovery.GANG].viable:
        assert "* would lose over 50% of its time recovering" in text


@pytest.mark.catalog
def test_json_carries_both_modes(tmp_path: Path) -> None:
    script = str(_script(tmp_path / "p", True))
    code, out, err = _run(
        script, "--recovery", "node", "--gpus", "H100:8", "--nodes", "4", "--spot", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["request"]["recovery"] == "node"
    assert data["request"]["heal_minutes"] == costmodel.DEFAULT_HEAL_MINUTES
    for entry in (data["choice"], *data["candidates"]):
        assert entry["recovery"] == "node"
        both = entry["by_recovery"]
        assert set(both) == {"gang", "node"}
        for figures in both.values():
            assert {"hours", "cost", "preemptions", "relaunches", "interval_hours"} <= set(figures)
            assert figures["viable"] == (figures["loss_fraction"] < costmodel.MAX_LOSS_FRACTION)
        assert entry["expected_cost"] == both["node"]["cost"]
        assert both["node"]["cost"] < both["gang"]["cost"]
    assert data["other_choice"]["by_recovery"]["gang"]["viable"] is True
    assert (
        Plan.model_validate(data).choice.by_recovery
        == make_plan(_request(Recovery.NODE)).choice.by_recovery
    )


@pytest.mark.catalog  # SkyPilot's GPU names
def test_recovery_node_on_one_node_is_one_line() -> None:
    code, out, err = _run("--gpus", "H100:8", "--recovery", "node")
    assert code == 2 and out == ""
    assert err.startswith("error: --recovery node needs --nodes 2") and err.count("\n") == 1
