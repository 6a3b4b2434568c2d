"""The fast network on the render side (`mncloud/render/network.py`): `network_tier: best` on
each entry whose fabric needs it, SkyPilot's schema and its offline dry run accept the task,
and one node, local runs and `--network standard` are left alone."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud.backends.base import LaunchRequest
from mncloud.backends.skypilot import SkyPilotBackend
from mncloud.cli import app
from mncloud.plan import PlanRequest, make_plan
from mncloud.render import render, template_variables
from mncloud.request import build_spec
from tests.conftest import HAVE_CATALOG
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(not HAVE_CATALOG, reason="needs the catalog snapshot")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def _entries(config: dict[str, Any]) -> list[dict[str, Any]]:
    resources = config["resources"]
    return [*resources.get("ordered", []), *resources.get("any_of", [])]


@pytest.mark.parametrize(
    ("cloud", "instance_type"), [("aws", "p5.48xlarge"), ("gcp", "a3-highgpu-8g")]
)
def test_multi_node_fabric_offer_gets_network_tier_best_pinned(
    script: Path, cloud: str, instance_type: str
) -> None:
    spec = build_spec(script, gpus="H100:8", nodes=4, cloud=cloud, name="llm")
    task = render(spec)  # validated by SkyPilot's schema and Task parser inside
    assert _entries(task.config) == [
        {"infra": f"{cloud}/*", "instance_type": instance_type, "network_tier": "best"}
    ]
    assert "network_tier" not in task.config["resources"]  # never task-wide (a cloud filter)
    efa = task.config["envs"].get("FI_PROVIDER")
    assert efa == ("efa" if cloud == "aws" else None)


def test_clouds_without_a_tier_best_fabric_keep_their_plain_entry(script: Path) -> None:
    spec = build_spec(script, gpus="H100:8", nodes=2, cloud=["aws", "lambda"], name="llm")
    entries = _entries(render(spec).config)
    assert {"infra": "lambda/*"} in entries
    assert {"infra": "aws/*", "instance_type": "p5.48xlarge", "network_tier": "best"} in entries


def test_planned_entries_carry_the_tier_only_where_the_fabric_needs_it(script: Path) -> None:
    from mncloud.plan import hardware

    spec = build_spec(script, gpus="H100:8", nodes=4, name="llm", spot=False)
    plan = make_plan(PlanRequest.from_spec(spec))
    entries = _entries(render(spec, plan=plan).config)
    assert entries
    for entry in entries:
        cloud = entry["infra"].split("/")[0]
        fast = hardware.network(cloud, entry["instance_type"]).fabric.tier_best
        assert ("network_tier" in entry) is fast, entry


@pytest.mark.parametrize(
    "flags",
    [
        {"nodes": 1, "cloud": "aws"},
        {"nodes": 4, "cloud": "aws", "network": "standard"},
    ],
)
def test_one_node_and_network_standard_render_no_tier(script: Path, flags: dict[str, Any]) -> None:
    spec = build_spec(script, gpus="H100:8", name="llm", **flags)
    task = render(spec)
    assert "network_tier" not in task.yaml_text
    assert "FI_PROVIDER" not in task.config["envs"]


def test_local_task_is_unchanged_and_expects_loopback(script: Path) -> None:
    spec = build_spec(script, gpus="cpu:1", nodes=2, cloud="local", name="llm")
    task = render(spec)
    assert "network_tier" not in task.yaml_text
    variables = template_variables(spec)
    assert variables["bandwidth_fabric"] == "loopback (local backend)"
    assert variables["bandwidth_expect"] > 0
    assert "--bandwidth --expect-busbw" in task.config["run"]
    # The preflight reads that fabric as loopback: reported, not judged (doctor/bandwidth.py).
    from mncloud.doctor.bandwidth import Bandwidth
    from mncloud.render.bandwidth import recorded_expectation

    expected = recorded_expectation(task.config["run"])
    assert expected is not None
    assert Bandwidth(2, "gloo", 0.01, expected_gbs=expected[0], fabric=expected[1]).on_loopback


def test_expectation_prices_one_efa_card_without_internal_ips(script: Path) -> None:
    spec = build_spec(script, gpus="H100:8", nodes=2, cloud="aws", name="llm")
    variables = template_variables(spec)
    # p5: 3,200 Gbps over 32 cards; one card (100 Gbps) × EFA's achievable at 2 nodes / 8 bits.
    assert variables["bandwidth_expect"] == pytest.approx(100 / 8 * 0.83, abs=1e-3)
    assert "1 of 32 cards" in variables["bandwidth_fabric"]


@pytest.mark.parametrize(("nodes", "achievable"), [(2, 0.83), (4, 0.715), (16, 0.6)])
def test_expectation_follows_the_node_count(script: Path, nodes: int, achievable: float) -> None:
    """EFA reaches 0.83 of its rate between 2 nodes and 0.6 from 8 on (hardware.yaml's
    published nccl-tests figures): the preflight expects what this run's node count gets."""
    spec = build_spec(script, gpus="H100:8", nodes=nodes, cloud="aws", name="llm")
    assert template_variables(spec)["bandwidth_expect"] == pytest.approx(
        100 / 8 * achievable, abs=1e-3
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--network", "efa"], "--network 'efa' is not a setting"),
        (["--min-bandwidth", "-2"], "--min-bandwidth -2.0 must be a positive number"),
        (["--min-bandwidth", "0"], "--min-bandwidth 0.0 must be a positive number"),
    ],
)
def test_bad_network_flags_are_one_line_exit_2(
    script: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], words: str
) -> None:
    monkeypatch.chdir(script.parent)
    result = CliRunner().invoke(
        app, ["render", "train.py", "--gpus", "H100:8", "--nodes", "2", *args]
    )
    assert result.exit_code == 2
    assert words in result.output
    assert "Traceback" not in result.output


def test_min_bandwidth_without_the_preflight_is_one_line_exit_2(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No preflight, no test to hold the fabric to the floor: refused, never ignored."""
    monkeypatch.chdir(script.parent)
    args = ["render", "train.py", "--gpus", "H100:8", "--nodes", "2", "--min-bandwidth", "5"]
    result = CliRunner().invoke(app, [*args, "--no-preflight"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--min-bandwidth 5 is checked by the preflight" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert CliRunner().invoke(app, args).exit_code == 0


def test_a_fabric_named_in_mncloud_yaml_is_one_line_exit_2(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(script.parent)
    (script.parent / "mncloud.yaml").write_text("network: infiniband\n")
    result = CliRunner().invoke(app, ["render", "train.py", "--gpus", "H100:8", "--nodes", "2"])
    assert result.exit_code == 2
    assert "'infiniband' is not a setting" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_skypilot_dry_run_passes_offline_with_network_tier_best(
    script: Path,
    cloud: str,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
) -> None:
    spec = build_spec(script, gpus="H100:8", nodes=4, cloud=cloud, spot=True, name="llm")
    plan = make_plan(PlanRequest.from_spec(spec))
    task = render(spec, plan=plan)
    assert all(e.get("network_tier") == "best" for e in _entries(task.config))
    status = SkyPilotBackend().launch(LaunchRequest(spec=spec, task=task, plan=plan, dryrun=True))
    assert "dry run passed" in status.detail, status.detail
    assert status.cloud == cloud
