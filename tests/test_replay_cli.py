"""`mncloud replay` through Typer's CliRunner: JSON keys, windows, the table, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from mncloud.cli import replay as replay_cli

runner = CliRunner()
KEYS = [
    "policy",
    "start_hours",
    "cost",
    "on_demand_cost",
    "met_deadline",
    "finished_hours",
    "spot_hours",
    "on_demand_hours",
    "idle_hours",
    "switches",
    "preemptions",
]


@pytest.fixture(autouse=True)
def narrow_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_cli, "console", Console(width=80))


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """100 h of 5-minute ticks: 4 nodes for 10 h, then none for 5 h, repeated."""
    data = ([4] * 120 + [0] * 60) * 7
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": data[:1200]}))
    return path


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test app."""

    replay_cli.register(app)
    return app


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(_app(), ["replay", *args])
    return result.exit_code, result.stdout, result.stderr


JOB = ("--nodes", "4", "--hours", "20", "--deadline", "30h", "--restart-overhead", "10m")


def test_json_has_exactly_the_issues_keys(trace: Path) -> None:
    code, out, err = _run(str(trace), *JOB, "--json", "--policy", "greedy")
    assert code == 0, err
    data = json.loads(out)
    assert list(data) == KEYS
    assert data["policy"] == "greedy" and data["met_deadline"] is True
    assert data["spot_hours"] + data["on_demand_hours"] >= 20


def test_every_gives_one_object_per_window_that_fits(trace: Path) -> None:
    code, out, err = _run(str(trace), *JOB, "--every", "24h", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [d["start_hours"] for d in data] == [0, 24, 48]  # 72 h + 30 h > 100 h
    assert all(d["policy"] == "adaptive" and d["met_deadline"] for d in data)


def test_table_fits_80_columns_and_ends_with_a_summary(trace: Path) -> None:
    code, out, err = _run(str(trace), *JOB, "--start", "48h")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "spot h" in out and "deadlines missed: 0" in out.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--deadline", "0h"), "--deadline '0h': it must be longer than 0"),
        (("--deadline", "20h"), "earliest feasible deadline is 20.1667 h"),
        (("--deadline", "soon"), "--deadline 'soon'"),
        (("--every", "200h"), "longer than the trace"),
        (("--start", "90h"), "does not fit"),
        (("--policy", "nope"), "--policy 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(trace: Path, args: tuple[str, ...], message: str) -> None:
    base = dict(zip(JOB[::2], JOB[1::2], strict=True))
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    code, out, err = _run(str(trace), *[x for kv in base.items() for x in kv])
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_missing_or_malformed_trace_says_which(tmp_path: Path) -> None:
    code, _, err = _run(str(tmp_path / "none.json"), *JOB)
    assert code == 2 and "no such file" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"metadata": {"gap": 300}, "data": [1]}))
    code, _, err = _run(str(bad), *JOB)
    assert code == 2 and "metadata.gap_seconds: " in err and err.count("\n") == 1
