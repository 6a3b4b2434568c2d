"""The SkyPilot cache (`skycache`, `catalog_index`, `taskcheck`, `storage.names`): every cached
answer equals SkyPilot's own, and a changed catalog file rebuilds the index."""

from __future__ import annotations

import copy
import csv
import json
import os
import random
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from mncloud import catalog, render
from mncloud.catalog import cache as skycache
from mncloud.catalog import index as catalog_index
from mncloud.errors import CatalogError, RenderError
from mncloud.plan import PlanRequest, make_plan
from mncloud.render import schema as taskcheck
from mncloud.request import build_spec
from mncloud.spec import Accelerator, SpotPolicy
from mncloud.storage.names import name_error

pytestmark = pytest.mark.catalog

REPO = Path(__file__).resolve().parents[1]


def _both(monkeypatch: pytest.MonkeyPatch, call: Any) -> tuple[Any, Any]:
    """`call()` answered from the cache, then straight from SkyPilot (cache off)."""

    def outcome() -> Any:
        try:
            return call()
        except (CatalogError, RenderError) as err:
            return f"{type(err).__name__}: {err}"

    cached = outcome()
    monkeypatch.setenv(skycache.CACHE_ENV, "0")
    try:
        live = outcome()
    finally:
        monkeypatch.delenv(skycache.CACHE_ENV)
    return cached, live


@pytest.mark.slow
def test_offers_from_the_index_equal_skypilots_for_every_accelerator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clouds = catalog.default_clouds()
    sections = catalog_index.sections(clouds)
    assert sections is not None
    pairs = {(row[2], int(row[3])) for s in sections.values() for row in s["rows"]}
    names = sorted({name for name, _ in pairs})
    cases = [(name, count, nodes) for name, count in sorted(pairs) for nodes in (1, 4)]
    cases += [(name, 3, 1) for name in names[:5]]  # a count nobody sells: the error text
    for name, count, nodes in cases:
        cached, live = _both(monkeypatch, partial(catalog.offers, name, count, nodes=nodes))
        assert cached == live, (name, count, nodes)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs",
    [
        {"use_spot": True},
        {"use_spot": False, "clouds": ["lambda", "aws"]},
        {"clouds": ["lambda"], "regions": ["US-EAST-2", "asia-south-1"]},
        {"clouds": ["runpod"]},
        {"clouds": ["aws", "nosuchcloud"]},
    ],
)
def test_filtered_offers_equal_skypilots(monkeypatch: pytest.MonkeyPatch, kwargs: dict) -> None:
    for gpus, nodes in (("H100", 4), ("A100-80GB", 2), ("A100-80GB", 1)):
        cached, live = _both(monkeypatch, partial(catalog.offers, gpus, 8, nodes=nodes, **kwargs))
        assert cached == live


PLAN_SCENARIOS: list[dict[str, Any]] = [
    *(
        {"gpus": g, "nodes": n, "spot": SpotPolicy.ON_DEMAND, "hours": 24}
        for g, n in [
            *[("H100:8", 4), ("H100:8", 1), ("A100-80GB:8", 2), ("A100:8", 1)],
            *[("H100:1", 1), ("A100-80GB:1", 1), ("L4:1", 1), ("A10G:1", 1)],
        ]
    ),
    *(
        {"gpus": g, "nodes": n, "spot": SpotPolicy.SPOT, "preemption_rate": 0.05}
        for g, n in [("H100:8", 4), ("A100-80GB:8", 2), ("A100:8", 2)]
    ),
    {"gpus": "H100:8", "nodes": 4, "hours": 24},
    {"gpus": "A100-80GB:1", "nodes": 1, "clouds": ["runpod"], "hours": 10},
    {"gpus": "H100:8", "nodes": 8, "preemption_rate": 1.0},
    {"gpus": "H100:8", "nodes": 8, "spot": SpotPolicy.SPOT, "preemption_rate": 1.0},
    {"gpus": "H100:8", "nodes": 4, "hours": 24, "max_hourly": 30},
    {"gpus": "H100:8", "nodes": 4, "hours": 24, "max_cost": 2500},
    {"gpus": "A100-80GB:8", "nodes": 2, "spot": SpotPolicy.ON_DEMAND, "clouds": ["aws", "gcp"]},
    {"gpus": "H100:8", "nodes": 4, "regions": ["us-east-1"], "clouds": ["aws"]},
]


@pytest.mark.parametrize("fields", PLAN_SCENARIOS)
def test_cached_and_uncached_plans_are_equal(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any]
) -> None:
    fields = dict(fields)
    accelerator = Accelerator.parse(fields.pop("gpus"))

    def plan() -> Any:
        return make_plan(PlanRequest.build(accelerator=accelerator, **fields)).model_dump()

    cached, live = _both(monkeypatch, plan)
    assert cached == live


def _plan_in_child(env: dict[str, str]) -> dict[str, Any]:
    """`mncloud plan --json` in a fresh process; whether it imported SkyPilot."""
    code = (
        "import sys, json, io, contextlib; from mncloud.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try: main()\n"
        "    except SystemExit: pass\n"
        "print(json.dumps({'plan': json.loads(out.getvalue()), 'sky': 'sky' in sys.modules}))\n"
    )
    argv = ["plan", "--gpus", "H100:8", "--nodes", "4", "--on-demand", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_changed_catalog_file_rebuilds_the_index(tmp_path: Path) -> None:
    snapshot = tmp_path / "catalogs"
    shutil.copytree(Path(os.environ[catalog.constants.CATALOG_DIR_ENV]), snapshot)
    env = {
        **os.environ,
        "MNCLOUD_HOME": str(tmp_path / "home"),
        "SKY_RUNTIME_DIR": str(tmp_path / "runtime"),
        catalog.constants.CATALOG_DIR_ENV: str(snapshot),
    }
    first = _plan_in_child(env)
    assert first["sky"]  # nothing cached yet: SkyPilot answered and the index was built
    again = _plan_in_child(env)
    assert not again["sky"] and again["plan"] == first["plan"]  # from the index alone

    vms = snapshot / "v8" / "lambda" / "vms.csv"
    os.utime(vms, ns=(vms.stat().st_atime_ns, vms.stat().st_mtime_ns + 10**9))  # touched
    touched = _plan_in_child(env)
    assert touched["sky"] and touched["plan"] == first["plan"]

    price = first["plan"]["choice"]["hourly_per_node"]
    # Halve every Lambda price (Lambda wins on-demand H100): SkyPilot's answer changes, so must
    # the cached one.
    with vms.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in ("Price", "SpotPrice"):
            if row[column]:
                row[column] = repr(float(row[column]) / 2)
    with vms.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    rebuilt = _plan_in_child(env)
    assert rebuilt["sky"]
    assert rebuilt["plan"]["choice"]["cloud"] == "lambda"
    assert rebuilt["plan"]["choice"]["hourly_per_node"] == pytest.approx(price / 2)
    assert not _plan_in_child(env)["sky"]


def test_accelerator_names_equal_skypilots(monkeypatch: pytest.MonkeyPatch) -> None:
    cached, live = _both(monkeypatch, catalog.accelerator_names)
    assert cached == live and "H100" in cached


def test_the_cached_schemas_are_skypilots() -> None:
    from sky.utils import schemas

    cached = taskcheck.schemas()
    assert cached["task"] == json.loads(json.dumps(schemas.get_task_schema()))
    assert cached["resources"] == json.loads(json.dumps(schemas.get_resources_schema()))


@pytest.mark.parametrize(
    ("cloud", "region"),
    [("aws", "us-east-1"), ("aws", "nowhere-1"), ("lambda", "us-east-2"), ("gcp", "us-east1")],
)
def test_region_answers_equal_skypilots(
    monkeypatch: pytest.MonkeyPatch, cloud: str, region: str
) -> None:
    cached, live = _both(monkeypatch, lambda: render._region_error(cloud, region))
    assert cached == live


def _base_configs(tmp_path: Path) -> list[dict[str, Any]]:
    (tmp_path / "pyproject.toml").write_text("")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    specs = [
        build_spec(script, gpus="H100:8", nodes=4),
        build_spec(script, gpus="H100:8", nodes=4, spot=True, env=["A=1"], secret=["HF_TOKEN"]),
        build_spec(script, gpus="cpu:2", nodes=2, disk_size=100),
        build_spec(script, gpus="A100-80GB:1", cloud=["aws", "gcp"]),
        build_spec(script, gpus="H100:8", cloud=["aws"], region=["us-east-1"]),
    ]
    configs = [render.render(spec).config for spec in specs]
    plan = make_plan(PlanRequest.build(accelerator=Accelerator.parse("H100:8"), nodes=4, hours=24))
    configs.append(render.render(specs[0], plan).config)
    return configs


MUTATIONS: list[tuple[str, Any]] = [
    ("num_node", 4),
    ("num_nodes", 0),
    ("num_nodes", "4"),
    ("num_nodes", True),
    ("resources.accelerators", "H100:0"),
    ("resources.accelerators", "H100:8x"),
    ("resources.accelerators", "NOPE:8"),
    ("resources.accelerators", "h100:8"),
    ("resources.accelerators", {"H100": 8}),
    ("resources.use_spot", "yes"),
    ("resources.infra", "aws/us-east-1"),
    ("resources.infra", "aws/nowhere-1"),
    ("resources.infra", "mars/x"),
    ("resources.infra", "aws/*"),
    ("resources.infra", "AWS/us-east-1"),
    ("resources.instance_type", "p5.48xlarge"),
    ("resources.instance_type", "p9.huge"),
    ("resources.disk_size", 0),
    ("resources.disk_size", "100"),
    ("resources.cpus", "x"),
    ("resources.job_recovery", {"strategy": "BOGUS"}),
    ("resources.any_of", [{"infra": "aws"}]),
    ("resources.image_id", "ami-123"),
    ("resources.network_tier", "best"),
    ("resources.network_tier", "fastest"),
    ("envs", {"A": None}),
    ("envs", {"A": 1}),
    ("envs", {"1X": "v"}),
    ("secrets", ["HF_TOKEN"]),
    ("secrets", {"secrets:A": "v"}),
    ("file_mounts", {}),
    ("workdir", "$HOME"),
    ("runn", "true"),
]


def _mutate(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    result = copy.deepcopy(config)
    where, _, key = path.rpartition(".")
    target = result[where] if where else result
    target[key] = value
    return result


@pytest.mark.slow
def test_fast_task_check_agrees_with_skypilot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bases = _base_configs(tmp_path)
    assert all(taskcheck.surely_valid(c) for c in bases)  # what mncloud renders is fast
    corpus = bases + [_mutate(b, p, v) for b in bases[:2] + bases[-1:] for p, v in MUTATIONS]
    fast = 0
    for config in corpus:
        cached, live = _both(monkeypatch, partial(render.validate_task_config, config))
        assert cached == live, config
        fast += taskcheck.surely_valid(config)
    assert fast < len(corpus)  # the mutations exercise SkyPilot's own path too
    assert "did you mean 'num_nodes'" in str(
        _both(monkeypatch, lambda: render.validate_task_config(_mutate(bases[0], "num_node", 1)))
    )


def test_bucket_name_rules_equal_skypilots() -> None:
    from sky.data import storage as sky_storage
    from sky.exceptions import StorageNameError

    rng = random.Random(15)
    alphabet = "abcxyz0129.-_AG"
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 70))) for _ in range(3000)]
    names += ["192.168.5.4", "xn--abc", "abc-s3alias", "abc--ol-s3", "googbucket", "a" * 64]
    names += ["my-google-bucket", "ab", "a.-b", "team-ckpt", "a" * 64 + "." + "b" * 10, "a" * 223]
    for scheme, store in (("s3", sky_storage.S3Store), ("gs", sky_storage.GcsStore)):
        for name in names:
            try:
                store.validate_name(name)
                expected = None
            except StorageNameError as err:
                expected = str(err).removeprefix("Invalid store name: ")
            assert name_error(scheme, name) == expected, (scheme, name)


def test_cloud_names_are_skypilots_registry() -> None:
    from sky.utils import registry

    assert catalog_index.cloud_names() == sorted(registry.CLOUD_REGISTRY.keys())
