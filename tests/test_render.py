"""Rendering: the task YAML parsed back by SkyPilot, and the run section executed under bash."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from mncloud import constants
from mncloud.errors import RenderError
from mncloud.render import render, validate_task_config
from mncloud.request import build_spec

pytestmark = pytest.mark.catalog


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def _sky_task(config: dict):
    import sky

    return sky.Task.from_yaml_config(copy.deepcopy(config))  # it pops keys


def test_spot_multi_node_task(script: Path) -> None:
    spec = build_spec(
        script,
        ["--lr", "3e-4"],
        gpus="H100:8",
        nodes=4,
        spot=True,
        bucket="s3://team-ckpt/exp",
        env=["WANDB_MODE=offline"],
        secret=["HF_TOKEN"],
        max_restarts=5,
        disk_size=512,
        label=["team=ml"],
    )
    task = render(spec)
    config = yaml.safe_load(task.yaml_text)
    assert config == task.config
    assert config["num_nodes"] == 4
    assert config["workdir"] == str(script.parent)
    resources = config["resources"]
    assert resources["accelerators"] == "H100:8" and resources["use_spot"] is True
    assert resources["disk_size"] == 512 and resources["labels"] == {"team": "ml"}
    assert resources["job_recovery"] == {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 5,
        "recover_on_exit_codes": [
            constants.PREEMPTED_EXIT_CODE,
            constants.STORAGE_OUTAGE_EXIT_CODE,
        ],
    }
    assert config["envs"][constants.CKPT_URI_ENV] == "s3://team-ckpt/exp/train"
    assert config["envs"][constants.PREEMPTION_WATCH_ENV] == "1"
    assert config["envs"]["WANDB_MODE"] == "offline"
    assert config["secrets"] == {"HF_TOKEN": None}
    assert "HF_TOKEN" not in config["envs"]
    assert "file_mounts" not in config
    sky_task = _sky_task(config)
    assert sky_task.num_nodes == 4
    (res,) = sky_task.resources
    assert res.use_spot and res.accelerators == {"H100": 8}
    run = config["run"]
    for fragment in (
        '--nnodes="$SKYPILOT_NUM_NODES"',
        '--nproc_per_node="$SKYPILOT_NUM_GPUS_PER_NODE"',
        '--node_rank="$SKYPILOT_NODE_RANK"',
        "--rdzv_backend=static",
        '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
        "MASTER_PORT=29500",
        "NCCL_SOCKET_IFNAME",
        "train.py --lr 3e-4",
    ):
        assert fragment in run


def test_single_node_spot_uses_eager_next_region(script: Path) -> None:
    config = render(build_spec(script, gpus="A100:8", spot=True)).config
    assert config["resources"]["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"


def test_on_demand_is_recovered_too_but_watches_for_no_notice(script: Path) -> None:
    """Every cloud run is a managed job (issue #33): on-demand VMs fail too, and user-code
    errors get `--max-restarts` whatever the market; only spot watches for preemption notices."""
    spec = build_spec(script, gpus="A100:8", nodes=2, spot=False, max_restarts=2)
    config = render(spec).config
    assert config["resources"]["use_spot"] is False
    assert config["resources"]["job_recovery"] == {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 2,
        "recover_on_exit_codes": [
            constants.PREEMPTED_EXIT_CODE,
            constants.STORAGE_OUTAGE_EXIT_CODE,
        ],
    }
    validate_task_config(config)
    assert constants.PREEMPTION_WATCH_ENV not in config["envs"]
    assert constants.CKPT_URI_ENV not in config["envs"]


def test_cloud_and_region_pins(script: Path) -> None:
    config = render(build_spec(script, gpus="H100:8", cloud=["aws"], region=["us-east-1"])).config
    assert config["resources"]["any_of"] == [{"infra": "aws/us-east-1"}]
    (res,) = _sky_task(config).resources
    assert str(res.cloud) == "AWS" and res.region == "us-east-1"


def test_several_clouds_become_any_of(script: Path) -> None:
    config = render(build_spec(script, gpus="H100:8", cloud=["aws", "gcp"])).config
    assert config["resources"]["any_of"] == [{"infra": "aws/*"}, {"infra": "gcp/*"}]
    assert {str(r.cloud) for r in _sky_task(config).resources} == {"AWS", "GCP"}


def test_regions_are_paired_with_their_cloud(script: Path) -> None:
    spec = build_spec(
        script, gpus="H100:8", cloud=["aws", "gcp"], region=["us-east-1", "us-central1"]
    )
    assert render(spec).config["resources"]["any_of"] == [
        {"infra": "aws/us-east-1"},
        {"infra": "gcp/us-central1"},
    ]


def test_mount_bucket_adds_a_cached_mount(script: Path) -> None:
    config = render(
        build_spec(script, gpus="H100:8", bucket="gs://team-ckpt/x", mount_bucket=True)
    ).config
    assert config["file_mounts"] == {
        "/mncloud-bucket": {"source": "gs://team-ckpt", "mode": "MOUNT_CACHED"}
    }


def test_setup_from_requirements_and_user_command(script: Path) -> None:
    spec = build_spec(
        script,
        gpus="L4",
        requirements=str(script.parent / "requirements.txt"),
        setup="echo 'custom setup'",
    )
    setup = render(spec).config["setup"]
    assert "pip install --quiet -r requirements.txt" in setup
    assert "echo 'custom setup'" in setup


def test_cpu_nodes_run_count_processes(script: Path) -> None:
    config = render(build_spec(script, gpus="cpu:3", nodes=2, cloud=["local"])).config
    assert config["resources"]["cpus"] == "3+"
    assert "--nproc_per_node=3" in config["run"]
    assert "any_of" not in config["resources"]


def test_own_template_gets_the_same_variables(script: Path, tmp_path: Path) -> None:
    template = tmp_path / "mine.yaml.j2"
    template.write_text(
        "name: {{ name | yaml }}\nnum_nodes: {{ num_nodes }}\nresources: {{ resources | yaml }}\n"
        "run: {% filter yaml_block %}{% include 'run.sh.j2' %}echo mine{% endfilter %}\n"
    )
    config = render(build_spec(script, gpus="H100:8", nodes=2), template=template).config
    assert config["name"] == "train" and config["num_nodes"] == 2
    assert config["run"].rstrip().endswith("echo mine")


def test_template_errors_are_one_line(script: Path, tmp_path: Path) -> None:
    template = tmp_path / "bad.yaml.j2"
    template.write_text("name: {{ no_such_variable }}\n")
    with pytest.raises(RenderError, match="no_such_variable"):
        render(build_spec(script, gpus="H100:8"), template=template)
    with pytest.raises(RenderError, match="does not exist"):
        render(build_spec(script, gpus="H100:8"), template=tmp_path / "missing.j2")


def test_skypilot_schema_catches_what_jsonschema_misses() -> None:
    with pytest.raises(RenderError, match="num_nodes"):
        validate_task_config({"num_node": 2, "run": "echo"})


def test_yaml_values_cannot_inject_keys(script: Path) -> None:
    spec = build_spec(script, gpus="H100:8", env=["A=x\nnum_nodes: 99", "B=: {}"], label=["k=v: w"])
    config = render(spec).config
    assert config["envs"]["A"] == "x\nnum_nodes: 99"
    assert config["envs"]["B"] == ": {}"
    assert config["num_nodes"] == 1


def _run_section_under_bash(config: dict, tmp_path: Path, env_extra: dict[str, str]) -> list[str]:
    """Execute the rendered `run` with a stub torchrun that records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    record = tmp_path / "argv.json"
    stub = bin_dir / "torchrun"
    stub.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2",
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "8",
        "SKYPILOT_TASK_ID": "sky-2026-11-21-task",
        **env_extra,
    }
    proc = subprocess.run(
        ["bash", "-c", config["run"]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(record.read_text())


def test_script_arguments_reach_torchrun_verbatim(script: Path, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    nasty = [
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        "it's",
        'a "b" c',
        "x;touch " + str(pwned),
        "--flag=$HOME",
        "multi\nline",
        "*",
        "",
    ]
    # No preflight: with mncloud importable (an activated venv) it would look for 8 GPUs here.
    spec = build_spec(script, nasty, gpus="H100:8", nodes=2, preflight=False)
    argv = _run_section_under_bash(render(spec).config, tmp_path / "run", {})
    assert argv[-len(nasty) :] == nasty
    assert argv[-len(nasty) - 2 :][:2] == ["--", "train.py"]
    assert "--nnodes=2" in argv and "--nproc_per_node=8" in argv and "--node_rank=1" in argv
    assert "--rdzv_endpoint=10.0.0.1:29500" in argv
    assert "--rdzv_id=sky-2026-11-21-task" in argv and "--rdzv_backend=static" in argv
    assert not pwned.exists()


def test_nccl_interface_given_or_kept(script: Path, tmp_path: Path) -> None:

    config = render(
        build_spec(script, gpus="H100:8", nccl_socket_ifname="eth1", nccl_debug="INFO")
    ).config
    assert "export NCCL_SOCKET_IFNAME=eth1" in config["run"]
    assert 'NCCL_DEBUG="${NCCL_DEBUG:-INFO}"' in config["run"]


#: Script arguments that torchrun would take for its own options (or abbreviations of them).
COLLIDING_ARGS = [
    "--log",
    "y",
    "--max",
    "3",
    "--nnodes",
    "3",
    "--rdzv-id",
    "x",
    "-m",
    "--standalone",
]


@pytest.mark.slow
def test_colliding_arguments_reach_the_script_through_real_torchrun(
    tmp_path: Path,
) -> None:
    """torchrun's own parser never sees the script's arguments: they arrive byte for byte."""
    import shutil
    import socket
    import sys

    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun is not installed (pip install 'mncloud[train]')")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname='p'\n")
    out = tmp_path / "argv.json"
    train = project / "train.py"
    train.write_text(
        "import json, os, sys\n"
        "if os.environ['RANK'] == '0':\n"
        f"    json.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n"
    )
    args = [*COLLIDING_ARGS, "it's", "$(id)"]
    spec = build_spec(train, args, gpus="cpu:1", cloud=["local"], preflight=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "PATH": f"{torchrun.parent}:{os.environ['PATH']}",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "SKYPILOT_TASK_ID": "sky-argv-test",
        "TMPDIR": str(tmp_path),
    }
    run = render(spec).config["run"].replace("MASTER_PORT=29500", f"MASTER_PORT={port}")
    proc = subprocess.run(
        ["bash", "-c", run], env=env, cwd=project, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text()) == args


def test_plan_that_picks_spot_under_the_default_market_sets_the_watch(script: Path) -> None:
    """Spot is decided once: when the plan picks it (no --spot given), the task is spot
    everywhere — use_spot, job_recovery, the preemption watch and the backend's market."""
    from mncloud.launch import prepare
    from mncloud.spec import SpotPolicy
    from mncloud.spec.launch import LaunchOptions

    spec = build_spec(script, gpus="H100:8", nodes=4, bucket="s3://team-ckpt")
    assert spec.spot is SpotPolicy.EITHER
    prepared = prepare(spec, LaunchOptions(hours=24))
    assert prepared.plan is not None and prepared.plan.choice.spot
    config = prepared.task.config
    assert prepared.task.spot is True
    assert config["resources"]["use_spot"] is True
    assert config["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert config["envs"][constants.PREEMPTION_WATCH_ENV] == "1"
    on_demand = prepare(spec.model_copy(update={"spot": SpotPolicy.ON_DEMAND}), LaunchOptions())
    assert on_demand.task.spot is False
    assert constants.PREEMPTION_WATCH_ENV not in on_demand.task.config["envs"]


def test_own_template_cannot_contradict_the_market(script: Path, tmp_path: Path) -> None:
    template = tmp_path / "mine.yaml.j2"
    template.write_text("name: {{ name }}\nresources:\n  use_spot: true\nrun: echo hi\n")
    with pytest.raises(RenderError, match="use_spot against the plan"):
        render(build_spec(script, gpus="H100:8", spot=False), template=template)
