"""`mncloud gpus`: the `--gpus` names from SkyPilot's catalog (the offline snapshot), and a
`--gpus` name the catalog does not know, refused with the nearest ones."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import catalog

pytestmark = pytest.mark.catalog
runner = CliRunner()


def cli(*args: str) -> Any:
    from mncloud.cli import app

    return runner.invoke(app, list(args))


def one_line_error(result: Any) -> str:
    assert result.exit_code == 2, result.output
    assert not result.stdout and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return str(lines[0])


def test_gpus_lists_names_counts_clouds_and_the_cheapest_prices() -> None:
    result = cli("gpus", "--json")
    assert result.exit_code == 0, result.output
    listed = {(g["accelerator"], g["count"]): g for g in json.loads(result.stdout)}
    assert {("H100", 8), ("A100-80GB", 8), ("L4", 1)} <= set(listed)
    h100 = listed[("H100", 8)]
    assert {"aws", "gcp", "lambda"} <= set(h100["clouds"])
    # The cheapest node prices are those `plan` ranks: SkyPilot's catalog through `offers`.
    for spot, key in ((False, "on_demand"), (True, "spot")):
        found = catalog.offers("H100", 8, clouds=h100["clouds"], use_spot=spot).offers
        cheapest = min(found, key=lambda o: o.hourly_price)
        assert h100[key] == pytest.approx(cheapest.hourly_price)
        assert h100[f"{key}_cloud"] == cheapest.cloud
    # Every listed name is one `--gpus` takes.
    assert {name for name, _ in listed} <= set(catalog.accelerator_names())


def test_gpus_filters_by_name_and_cloud() -> None:
    result = cli("gpus", "h100", "--cloud", "AWS", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and all("h100" in r["accelerator"].lower() for r in rows)
    assert all(r["clouds"] == ["aws"] for r in rows)
    table = cli("gpus", "A100").stdout
    assert "A100:8" in table and "A100-80GB:8" in table and "H100" not in table


def test_gpus_table_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from mncloud.cli import _common

    monkeypatch.setattr(_common.console, "width", 80)
    result = cli("gpus")
    assert result.exit_code == 0, result.output
    assert "H100:8" in result.stdout and "$" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    "args,needle",
    [
        (["gpus", "H1OO"], "did you mean H100"),
        (["gpus", "xyz-nothing"], "`mncloud gpus` lists them all"),
        (["gpus", "--cloud", "nope"], "--cloud 'nope' is unknown"),
        (["gpus", "--cloud", "local"], "cpu:N"),
    ],
)
def test_gpus_bad_input_is_one_line(args: list[str], needle: str) -> None:
    assert needle in one_line_error(cli(*args))


@pytest.mark.parametrize("command", ["plan", "render"])
def test_an_unknown_gpus_name_suggests_the_nearest(command: str, project: Any) -> None:
    args = [command] if command == "plan" else [command, str(project / "train.py")]
    line = one_line_error(cli(*args, "--gpus", "h10:8"))
    assert "--gpus 'h10'" in line and "did you mean H100" in line and "mncloud gpus" in line
    line = one_line_error(cli(*args, "--gpus", "a100-80g:8"))
    assert "A100-80GB" in line
