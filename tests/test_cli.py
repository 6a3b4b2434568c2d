"""The CLI as users call it: `mncloud render …`, bad input, import cost, frozen options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mncloud.cli import app

pytestmark = pytest.mark.catalog
runner = CliRunner()


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return path


def test_render_prints_a_valid_task(script: Path) -> None:
    args = [
        "render",
        "train.py",
        "--gpus",
        "H100:8",
        "--nodes",
        "4",
        "--spot",
        "--bucket",
        "s3://team-ckpt",
        "--",
        "--lr",
        "3e-4",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert config["num_nodes"] == 4
    assert config["resources"]["accelerators"] == "H100:8"
    assert config["resources"]["use_spot"] is True
    assert config["envs"]["MNCLOUD_CKPT_URI"] == "s3://team-ckpt/train"
    assert "train.py --lr 3e-4" in config["run"]


def test_render_json_and_output_file(script: Path, tmp_path: Path) -> None:
    base = ["render", "train.py", "--gpus", "A100-80GB:4", "--nodes", "2", "--on-demand"]
    as_json = runner.invoke(app, [*base, "--json"])
    assert as_json.exit_code == 0, as_json.output
    config = json.loads(as_json.stdout)
    out = tmp_path / "task.yaml"
    written = runner.invoke(app, [*base, "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert yaml.safe_load(out.read_text()) == config
    assert config["resources"]["accelerators"] == "A100-80GB:4"


@pytest.mark.slow
def test_render_flags_reach_the_task(script: Path) -> None:
    args = [
        "render",
        "train.py",
        "--gpus",
        "L4:1",
        "--cloud",
        "gcp",
        "--region",
        "us-central1",
        "--env",
        "A=1",
        "--secret",
        "HF_TOKEN",
        "--label",
        "team=ml",
        "--disk-size",
        "100",
        "--image",
        "docker:pytorch/pytorch:latest",
        "--max-restarts",
        "7",
        "--spot",
        "--setup",
        "echo ready",
        "--master-port",
        "29600",
        "--nccl-debug",
        "WARN",
        "--name",
        "exp-1",
        "--bucket",
        "gs://team-ckpt",
        "--mount-bucket",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert config["name"] == "exp-1"
    resources = config["resources"]
    assert resources["any_of"] == [{"infra": "gcp/us-central1"}]
    assert resources["labels"] == {"team": "ml"} and resources["disk_size"] == 100
    assert resources["image_id"] == "docker:pytorch/pytorch:latest"
    assert resources["job_recovery"]["max_restarts_on_errors"] == 7
    assert config["secrets"] == {"HF_TOKEN": None} and config["envs"]["A"] == "1"
    assert "echo ready" in config["setup"] and "MASTER_PORT=29600" in config["run"]
    assert config["file_mounts"]["/mncloud-bucket"]["source"] == "gs://team-ckpt"


@pytest.mark.slow
def test_render_with_plan_orders_the_cheapest_offers(script: Path) -> None:
    args = ["render", "train.py", "--gpus", "H100:8", "--nodes", "4", "--spot", "--plan"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ordered = yaml.safe_load(result.stdout)["resources"]["ordered"]
    from mncloud.plan import PlanRequest, make_plan
    from mncloud.plan.hardware import network
    from mncloud.render.network import with_tiers
    from mncloud.request import build_spec

    spec = build_spec(script, gpus="H100:8", nodes=4, spot=True)
    plan = make_plan(PlanRequest.from_spec(spec))
    assert len(ordered) >= 2
    # exactly what `up` would hand SkyPilot: the plan's entries, the fast fabric's asked for
    assert ordered == with_tiers(spec, plan.ordered_resources())
    fast = network(plan.choice.cloud, plan.choice.instance_type).fabric.tier_best
    assert ordered[0] == {
        "infra": f"{plan.choice.cloud}/{plan.choice.region}",
        "instance_type": plan.choice.instance_type,
        "accelerators": "H100:8",
        "use_spot": True,
        **({"network_tier": "best"} if fast else {}),
    }
    assert all(entry["use_spot"] is True for entry in ordered)


def test_secret_values_never_rendered(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_planted_secret_value")
    result = runner.invoke(app, ["render", "train.py", "--gpus", "H100:8", "--secret", "HF_TOKEN"])
    assert result.exit_code == 0, result.output
    assert "hf_planted_secret_value" not in result.output


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--gpus", "H100:0"], "at least 1"),
        (["--gpus", "FOO:8"], "knows no accelerator"),
        (["--gpus", "H100:x"], "not a whole number"),
        (["--gpus", "H100:8", "--nodes", "0"], "--nodes 0"),
        (["--gpus", "H100:8", "--nodes", "-1"], "--nodes -1"),
        (["--gpus", "H100:8", "--bucket", "ftp://x"], "use s3://"),
        (["--gpus", "H100:8", "--bucket", "s3://Bad_Name"], "lowercase"),
        (["--gpus", "H100:8", "--env", "NOVALUE"], "KEY=VALUE"),
        (["--gpus", "H100:8", "--cloud", "nocloud"], "unknown"),
        (["--gpus", "H100:8", "--cloud", "aws", "--region", "mars-1"], "us-east-1, us-east-2"),
        (["--gpus", "H100:8", "--cloud", "gcp", "--region", "us-east-1"], "us-central1"),
        (["--gpus", "H100:8", "--nodes", "99999999999999999999"], "from 1 to 1024"),
        (["--gpus", "H100:8", "--env", "AWS_SECRET_ACCESS_KEY=abcd"], "--secret AWS_SECRET"),
        (["--gpus", "H100:8", "--env", "HF_TOKEN=hf_x"], "--secret HF_TOKEN"),
        (["--gpus", "H100:8", "--env", "X=AKIA" + "ABCDEFGHIJKLMNOP"], "looks like a credential"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(script: Path, flags: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["render", "train.py", *flags])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("nodes: null\ngpu: null\n", "unknown option 'gpu' (did you mean 'gpus'?)"),
        ("nodes: null\nlauncher: mpi\n", "--launcher 'mpi' is unknown"),
        ("nodes: null\nnodes_: 2\n", "unknown option 'nodes_'"),
    ],
)
def test_mncloud_yaml_null_is_unset_and_bad_keys_one_line(
    script: Path, yaml_text: str, fragment: str
) -> None:
    """`key: null` in mncloud.yaml is unset (the flag or the default decides); beside it, a bad
    key or value is still one line, exit 2."""
    (script.parent / "mncloud.yaml").write_text("nodes: null\nspot: null\nmax_restarts: null\n")
    ok = runner.invoke(app, ["render", "train.py", "--gpus", "H100:8"])
    assert ok.exit_code == 0, ok.output
    config = yaml.safe_load(ok.stdout)
    assert config["num_nodes"] == 1
    assert config["resources"]["job_recovery"]["max_restarts_on_errors"] == 3
    flagged = runner.invoke(app, ["render", "train.py", "--gpus", "H100:8", "--nodes", "3"])
    assert flagged.exit_code == 0 and yaml.safe_load(flagged.stdout)["num_nodes"] == 3
    (script.parent / "mncloud.yaml").write_text(yaml_text)
    result = runner.invoke(app, ["render", "train.py", "--gpus", "H100:8"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert "Traceback" not in result.output


def test_secret_looking_env_only_when_the_user_insists(script: Path) -> None:
    base = ["render", "train.py", "--gpus", "H100:8", "--env", "HF_TOKEN=hf_x"]
    result = runner.invoke(app, [*base, "--allow-secret-env"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["envs"]["HF_TOKEN"] == "hf_x"
    plain = runner.invoke(app, ["render", "train.py", "--gpus", "H100:8", "--env", "LR=3e-4"])
    assert plain.exit_code == 0, plain.output


def test_missing_script_is_one_line(script: Path) -> None:
    result = runner.invoke(app, ["render", "nope.py", "--gpus", "H100:8"])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.output


def test_console_script_exit_code_and_stderr(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mncloud", "render", "train.py", "--gpus", "H100:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "at least 1" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
def test_offline_catalog_failure_prints_only_our_line(tmp_path: Path) -> None:
    """SkyPilot's download spinner and failure line never reach the user: one line, exit 2."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MNCLOUD_CATALOG_DIR"}
    env |= {
        "SKY_RUNTIME_DIR": str(tmp_path / "sky"),  # an empty runtime: no catalog on disk
        "MNCLOUD_HOME": str(tmp_path / "home"),
        "HTTPS_PROXY": "http://127.0.0.1:9",  # the download fails fast, online or not
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "mncloud", "plan", "--gpus", "H100:8", "--nodes", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "catalog" in lines[0]


def test_help_imports_neither_torch_nor_skypilot() -> None:
    code = (
        "import sys\nfrom mncloud.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('\\nLOADED', 'torch' in sys.modules, 'sky' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("LOADED False False")


RENDER_OPTIONS = {
    "--allow-secret-env",
    "--gpus",
    "--nodes",
    "--min-nodes",
    "--spot",
    "--on-demand",
    "--cloud",
    "--region",
    "--bucket",
    "--mount-bucket",
    "--resume-args",
    "--env",
    "--secret",
    "--setup",
    "--requirements",
    "--disk-size",
    "--image",
    "--label",
    "--max-hourly",
    "--max-restarts",
    "--master-port",
    "--nccl-debug",
    "--nccl-socket-ifname",
    "--network",
    "--parallel",  # how the model is spread over the GPUs (#45)
    "--min-bandwidth",
    "--require-path",
    "--preflight",
    "--no-preflight",
    "--launcher",
    "--ckpt-dir",
    "--recovery",
    "--tracker",
    "--name",
    "--catalog",
    "--template",
    "-o",
    "--output",
    "--json",
    "--plan",
    "--hours",
    # `render --plan` plans exactly as `up` does, so it takes up's model options too.
    "--max-cost",
    "--preemption-rate",
    "--learn",
    "--recovery-minutes",
    "--ckpt-seconds",
    "--hazards-from",
    # cost to finish (#34): the work in steps, the step's cost by flags, what to rank by.
    "--steps",
    "--minimize",
    "--params",
    "--flops-per-step",
    "--tokens-per-step",
    # step times that match published runs (#44): the step described in full.
    "--seq-len",
    "--layers",
    "--hidden",
    "--recompute",
    "--micro-batches",
    "--grad-bytes",
}


def test_render_options_are_frozen() -> None:
    """A new flag is a decision: add it here on purpose."""
    import typer.main

    command = typer.main.get_command(app).commands["render"]  # type: ignore[attr-defined]
    names = {
        opt
        for param in command.params
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("-")
    }
    assert names == RENDER_OPTIONS
