"""`mncloud plan` end to end through Typer's CliRunner: table, JSON, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from mncloud.cli import plan as plan_cli
from mncloud.constants import CATALOG_DIR_ENV as CATALOG_ENV
from mncloud.plan import costmodel
from mncloud.records.store import append_event, create_record
from mncloud.request import build_spec
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console 200 columns wide, whatever $COLUMNS was when rich first looked."""
    monkeypatch.setattr(plan_cli, "console", Console(width=200))


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test app: one command, called the way users call it."""

    plan_cli.register(app)
    return app


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(_app(), ["plan", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_importing_the_command_does_not_import_skypilot() -> None:
    code = "import sys, mncloud.cli.plan; print('sky' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.catalog
def test_table_cheapest_expected_cost_first_then_why() -> None:
    code, out, _ = _run("--gpus", "H100:8", "--nodes", "4", "--hours", "24")
    assert code == 0, out
    lines = out.splitlines()
    for words in (("offer", "job", "hours", "cost", "preempt.", "every"), ("node", "exp.", "ckpt")):
        assert any(all(w in line for w in words) for line in lines), words
    first = next(i for i, line in enumerate(lines) if "gcp us-east4" in line)
    assert "$2,609.66" in lines[first] and "11 min" in lines[first] and "20.04" in lines[first]
    assert "a3-highgpu-8g spot" in lines[first + 1] and "80.18" in lines[first + 1]
    lambda_rows = [line for line in lines if line.lstrip().startswith("lambda")]
    assert len(lambda_rows) == 1 and "+16 regions" in lambda_rows[0]  # identical rows grouped
    assert "spot gcp a3-highgpu-8g in us-east4 wins" in out
    assert "excluded" not in out and "By a" not in out  # no deadline table without --deadline


@pytest.mark.catalog
def test_plan_table_reads_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A default terminal (or a pipe): every cost, region and instance type whole."""
    monkeypatch.setattr(plan_cli, "console", Console(width=80))
    code, out, _ = _run("--gpus", "H100:8", "--nodes", "4", "--hours", "24")
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    for text in ("$2,609.66", "us-east4", "a3-highgpu-8g spot", "gpu_8x_h100_sxm5 on-demand"):
        assert text in out


@pytest.mark.catalog
def test_top_limits_rows_and_verbose_shows_exclusions() -> None:
    code, out, _ = _run("--gpus", "H100:8", "--nodes", "4", "--top", "2", "--verbose")
    assert code == 0, out
    assert (
        sum(line.lstrip().startswith(("aws ", "gcp ", "lambda ")) for line in out.splitlines()) == 2
    )
    assert "more; drop --top" in out
    assert "excluded lambda: spot_instance" in out
    assert "recovery 10 min; checkpoint 60 s" in out


@pytest.mark.catalog
def test_json_on_demand_two_clouds() -> None:
    code, out, _ = _run(
        "--gpus", "A100-80GB:8", "--nodes", "2", "--on-demand", "--cloud", "aws", "--cloud", "gcp",
        "--json",
    )  # fmt: skip
    assert code == 0, out
    data = json.loads(out)
    assert {"choice", "candidates", "checkpoint_interval_s", "fallbacks", "explanation"} <= set(
        data
    )
    fields = ("cloud", "region", "instance_type", "spot", "hourly_per_node", "hourly_total")
    for c in data["candidates"]:
        assert all(f in c for f in (*fields, "expected_hours", "expected_cost"))
        assert c["cloud"] in ("aws", "gcp") and c["spot"] is False
        assert c["hourly_total"] == pytest.approx(2 * c["hourly_per_node"])
    costs = [c["expected_cost"] for c in data["candidates"]]
    assert costs == sorted(costs)
    assert data["choice"] == data["candidates"][0]
    _, limited, _ = _run("--gpus", "A100-80GB:8", "--on-demand", "--json", "--top", "1")
    assert len(json.loads(limited)["candidates"]) == 1


@pytest.mark.catalog
def test_model_options_reach_the_plan() -> None:
    args = ("--gpus", "H100:8", "--nodes", "4", "--spot", "--json", "--top", "1")
    _, default_out, _ = _run(*args)
    code, custom_out, err = _run(
        *args, "--preemption-rate", "0.1", "--recovery-minutes", "20", "--ckpt-seconds", "120"
    )
    assert code == 0, err
    default, custom = json.loads(default_out), json.loads(custom_out)
    assert default["request"]["recovery_minutes"] == 10.0
    assert (custom["request"]["recovery_minutes"], custom["request"]["ckpt_seconds"]) == (20, 120)
    assert custom["choice"]["preemption_rate"] == 0.1
    assert custom["choice"]["hazard_source"] == "--preemption-rate"
    assert default["choice"]["hazard_source"].startswith("traces, gcp")
    # 0.1/node-h is below the traces' hazards: the same choice, fewer preemptions priced in.
    assert custom["choice"]["expected_cost"] < default["choice"]["expected_cost"]


def _history(tmp_path: Path, name: str, cloud: str, spot: bool, preemptions: int) -> None:
    """A finished 4-node run on `cloud`, preempted every half hour, in this test's records."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "train.py").write_text("print('hi')\n")
    gpus = "cpu:2" if cloud == "local" else "H100:8"
    spec = build_spec(tmp_path / "train.py", gpus=gpus, nodes=4, cloud=[cloud], name=name)
    create_record(spec, "a: 1\n", backend="local" if cloud == "local" else "skypilot")
    t = 1_000_000.0
    append_event(name, "launch", cloud=cloud, spot=spot, hourly_price=40.0, at=t)
    for _ in range(preemptions):
        t += 1800
        append_event(name, "preemption", node=1, at=t)
        append_event(name, "recovery", at=t)
    append_event(name, "finish", at=t + 1800)


@pytest.mark.slow
@pytest.mark.catalog
def test_learn_feeds_observed_preemptions_into_the_plan(tmp_path: Path) -> None:
    # aws: 20 preemptions in 21 half-hour segments × 4 nodes = 42 spot node-hours.
    _history(tmp_path, "bad-aws", "aws", True, 20)
    _history(tmp_path, "sim", "local", True, 30)  # this machine's nodes: must not count
    _history(tmp_path, "od-gcp", "gcp", False, 5)  # on-demand: not spot history
    args = ("--gpus", "H100:8", "--nodes", "4", "--hours", "24", "--spot", "--json")
    _, prior_out, _ = _run(*args)
    code, learned_out, err = _run(*args, "--learn")
    assert code == 0, err
    prior, learned = json.loads(prior_out), json.loads(learned_out)
    prior_aws = costmodel.spot_hazard("aws")  # the traces' hazard for aws, 0.494
    hazard = (20 + prior_aws * 50) / (42 + 50)  # blended with H₀ = 50 node-hours of the prior
    assert prior["request"]["hazards"] == {} and prior["request"]["learned"] == []
    assert learned["request"]["hazards"] == {"aws": pytest.approx(hazard)}
    (item,) = learned["request"]["learned"]
    assert (item["cloud"], item["preemptions"], item["node_hours"]) == ("aws", 20, 42.0)
    assert item["weight"] == pytest.approx(42 / 92)
    # The learned rate (0.486) replaces the traces' for every aws region, us-east-1's 0.673
    # included, which 4 nodes could not use: now they can, and aws us-east-1 wins.
    assert prior["choice"]["cloud"] == "gcp"
    assert not any(c["cloud"] == "aws" and c["region"] == "us-east-1" for c in prior["candidates"])
    assert (learned["choice"]["cloud"], learned["choice"]["region"]) == ("aws", "us-east-1")
    assert learned["choice"]["preemption_rate"] == pytest.approx(hazard)
    assert learned["choice"]["hazard_source"] == "learned from run records"
    gcp = [c for c in learned["candidates"] if c["cloud"] == "gcp"]
    assert gcp and all(c["hazard_source"].startswith("traces, gcp") for c in gcp)
    # An explicit --preemption-rate still wins for every cloud.
    pinned = json.loads(_run(*args, "--learn", "--preemption-rate", "0.3")[1])
    assert {c["preemption_rate"] for c in pinned["candidates"]} == {0.3}
    # --verbose says what was learned, and where every hazard came from.
    code, out, _ = _run("--gpus", "H100:8", "--nodes", "4", "--spot", "--learn", "--verbose")
    assert code == 0
    assert "spot hazard aws us-east-1" in out and "0.486/node-h (learned from run records)" in out
    assert (
        "spot hazard gcp us-east4, europe-west4, asia-northeast1: 0.257/node-h (traces, gcp:" in out
    )
    assert "learned aws: 20 preemptions in 42.0 spot node-h (0.476/node-h)" in out
    assert "blended with the prior 0.494 at 46% weight → 0.486/node-h" in out


@pytest.mark.slow
@pytest.mark.catalog
def test_up_learn_reaches_the_plan_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from mncloud.cli import app
    from mncloud.cli import options as opts
    from mncloud.cli import up as up_cli

    for command in (plan_cli.plan_command, up_cli.up_command):  # one declaration, no drift
        assert inspect.signature(command).parameters["learn"].annotation == opts.Learn
    _history(tmp_path, "bad-aws", "aws", True, 20)
    seen = []

    def stop(plan: Any, *_args: object, **_kwargs: object) -> None:
        seen.append(plan.request)
        raise typer.Exit(code=3)

    monkeypatch.setattr(up_cli, "_show_and_confirm", stop)
    script = str(tmp_path / "train.py")
    for extra in ((), ("--learn",)):
        result = runner.invoke(app, ["up", script, "--gpus", "H100:8", "--spot", *extra])
        assert result.exit_code == 3, result.output
    assert seen[0].hazards == {} and not seen[0].learned
    assert seen[1].hazards == {"aws": pytest.approx((20 + costmodel.spot_hazard("aws") * 50) / 92)}


@pytest.mark.catalog
def test_learn_without_history_says_so() -> None:
    code, out, _ = _run("--gpus", "H100:8", "--learn", "--top", "1")
    assert code == 0
    assert "no spot node-hours in this machine's run records yet" in out


@pytest.mark.catalog
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "H100:3"), "Available for H100"),
        (("--gpus", "H100:8", "--cloud", "runpod"), "no offer for H100:8 on runpod"),
        (("--gpus", "H100:8", "--nodes", "4", "--max-hourly", "30"), "over budget"),
        (("--gpus", "H100:8", "--spot", "--cloud", "lambda"), "Spot instances are not supported"),
        (("--gpus", "H100:8", "--cloud", "mars"), "--cloud 'mars' is unknown"),
        (("--gpus", "cpu:2"), "nothing to plan"),
    ],
)
@pytest.mark.usefixtures("sky_enabled_clouds")  # with none, `plan` says it runs locally, exit 0
def test_errors_are_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    code, out, err = _run(*args)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_catalog_flag_checks_the_folder(tmp_path: Path) -> None:
    code, _, err = _run("--gpus", "H100:8", "--catalog", str(tmp_path))
    assert code == 2
    assert "has no v8/" in err


@pytest.mark.slow
@pytest.mark.catalog
def test_catalog_flag_alone_points_skypilot_at_the_snapshot(tmp_path: Path) -> None:
    """A fresh process with only --catalog: the snapshot's clouds, nothing fetched."""
    snapshot = os.environ["MNCLOUD_CATALOG_DIR"]
    env = {k: v for k, v in os.environ.items() if k not in ("SKY_RUNTIME_DIR", CATALOG_ENV)}
    env.update(MNCLOUD_HOME=str(tmp_path / "home"), COLUMNS="200")
    code = "from mncloud.cli import main; main()"
    args = ["plan", "--gpus", "H100:8", "--catalog", snapshot, "--top", "1", "--verbose"]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "wins" in out.stdout
    assert "unavailable" not in out.stdout + out.stderr
    assert (tmp_path / "home" / "sky-runtime").is_dir()


@pytest.mark.slow
@pytest.mark.catalog
def test_a_plan_imports_neither_skypilot_nor_numpy() -> None:
    """A plan answers from the cached offers index and the measured hazard constants; numpy
    (traces, the deadline replay) and SkyPilot load only when those are asked for."""
    code = (
        "import sys\nfrom mncloud.cli import main\n"
        "try:\n    main(['plan', '--gpus', 'H100:8', '--nodes', '4', '--json'])\n"
        "except SystemExit:\n    pass\n"
        "print('LOADED', 'numpy' in sys.modules, 'sky' in sys.modules, file=sys.stderr)\n"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, timeout=300)
    proc = subprocess.run(  # the second run: the cache is built
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert proc.stderr.strip().splitlines()[-1] == "LOADED False False", proc.stderr[-500:]
