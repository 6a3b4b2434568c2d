"""`--launcher torchrun|accelerate|deepspeed|none`: the rendered task (SkyPilot's own checks),
the run section executed under bash with a stub launcher (exact arguments, hostile script
arguments arriving literally), and real 2-node local runs through each launcher that is
installed here (accelerate and deepspeed are in the dev extra; both run on CPU)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud.backends.base import RunState
from mncloud.cli import app
from mncloud.render import render
from mncloud.request import build_spec
from mncloud.spec import Launcher
from tests.test_local import run_log, up, wait_final

pytestmark = pytest.mark.catalog
runner = CliRunner()

#: Script arguments that look like the launchers' own options, and shell that must not run.
HOSTILE = [
    "--num_processes", "9", "--hostfile=/etc/passwd", "--node_rank=5", "--master_port", "1",
    "--nnodes", "7", "--", "-m", "$(touch PWNED)", "`touch PWNED`", "x;touch PWNED", "it's",
    'a "b" c', "multi\nline", "*", "",
]  # fmt: skip


@pytest.mark.parametrize("launcher", [m.value for m in Launcher])
def test_skypilot_accepts_the_task_of_every_launcher(project: Path, launcher: str) -> None:
    """Each rendered task passes SkyPilot's schema and parser, asked directly."""
    import sky
    from sky.utils import common_utils, schemas

    spec = build_spec(
        project / "train.py", HOSTILE, gpus="H100:8", nodes=2, launcher=launcher,
        bucket="s3://team-ckpt/exp", ckpt_dir="/ckpt",
    )  # fmt: skip
    config = render(spec).config
    common_utils.validate_schema(config, schemas.get_task_schema(), "")
    task = sky.Task.from_yaml_config(copy.deepcopy(config))
    assert task.num_nodes == 2
    assert (f" --launcher {launcher} " in config["run"]) is (launcher != "none")


def _run_section(
    config: dict[str, Any], cwd: Path, stubs: list[str], nodes: int = 2
) -> tuple[list[str], dict]:
    """Execute the rendered `run` as the last of `nodes` nodes with stub programs that record
    their argv and environment."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = cwd / "record.json"
    for name in stubs:
        stub = bin_dir / name
        stub.write_text(
            f"#!{sys.executable}\nimport json, os, sys\n"
            f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, "
            f"open({str(record)!r}, 'w'))\n"
        )
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(cwd),
        "TMPDIR": str(cwd),
        "SKYPILOT_NODE_IPS": "\n".join(f"10.0.0.{n + 1}" for n in range(nodes)),
        "SKYPILOT_NODE_RANK": str(nodes - 1),
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NUM_GPUS_PER_NODE": "8",
        "SKYPILOT_TASK_ID": "sky-task",
    }
    proc = subprocess.run(
        ["bash", "-c", config["run"]], env=env, cwd=cwd, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert not (cwd / "PWNED").exists()
    data = json.loads(record.read_text())
    return data["argv"], data["env"]


EXPECTED = {
    "torchrun": [
        "--nnodes=2", "--nproc_per_node=8", "--node_rank=1", "--rdzv_backend=static",
        "--rdzv_endpoint=10.0.0.1:29500", "--rdzv_id=sky-task",
        "--max_restarts=0",
    ],
    "accelerate": [
        "launch", "--multi_gpu", "--num_machines=2", "--machine_rank=1",
        "--main_process_ip=10.0.0.1", "--main_process_port=29500", "--num_processes=16",
    ],
    "deepspeed": [
        "--hostfile={hostfile}", "--no_ssh", "--node_rank=1", "--master_addr=10.0.0.1",
        "--master_port=29500",
    ],
}  # fmt: skip


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate", "deepspeed"])
def test_the_launcher_gets_exactly_these_arguments(
    project: Path, tmp_path: Path, launcher: str
) -> None:
    spec = build_spec(
        project / "train.py", HOSTILE, gpus="H100:8", nodes=2, launcher=launcher, preflight=False
    )
    argv, _env = _run_section(render(spec).config, tmp_path / "node", [launcher])
    hostfile = tmp_path / "node" / "mncloud-hostfile-sky-task-1"
    expected = [a.format(hostfile=hostfile) for a in EXPECTED[launcher]]
    assert argv == [*expected, "--", "train.py", *HOSTILE]
    if launcher == "deepspeed":
        assert hostfile.read_text() == "10.0.0.1 slots=8\n10.0.0.2 slots=8\n"


def test_one_process_in_all_is_not_multi_gpu(project: Path, tmp_path: Path) -> None:
    """accelerate refuses --multi_gpu for a single process; the run section leaves it out."""
    spec = build_spec(project / "train.py", gpus="cpu:1", launcher="accelerate", preflight=False)
    argv, _env = _run_section(render(spec).config, tmp_path / "node", ["accelerate"], nodes=1)
    assert "--multi_gpu" not in argv and "--num_processes=1" in argv


@pytest.mark.parametrize("script", ["train.py", "train.sh", "train"])
def test_none_runs_the_script_itself_with_the_rendezvous_exported(
    project: Path, tmp_path: Path, script: str
) -> None:
    """python for .py, bash for .sh, else the file as a program; the arguments literal."""
    recorder = (
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open('record.json', 'w'))"
    )
    path = project / script
    if script.endswith(".sh"):
        path.write_text(f'exec {sys.executable} -c "import json, os, sys; {recorder}" "$@"\n')
    else:
        path.write_text(f"#!{sys.executable}\nimport json, os, sys\n{recorder}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    spec = build_spec(path, HOSTILE, gpus="H100:8", nodes=2, launcher="none", preflight=False)
    config = render(spec).config
    node = tmp_path / "node"
    shutil.copytree(project, node)
    stubs = ["python"] if script.endswith(".py") else []
    argv, env = _run_section(config, node, stubs)
    assert argv == (["train.py", *HOSTILE] if stubs else HOSTILE)
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES")} == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "1", "NNODES": "2",
    }  # fmt: skip
    assert env["GPUS_PER_NODE"] == "8"


def test_an_unknown_launcher_is_one_line_and_exit_2(project: Path) -> None:
    args = ["render", str(project / "train.py"), "--gpus", "H100:8", "--launcher", "mpirun"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--launcher 'mpirun' is unknown" in lines[0], result.output
    assert "torchrun, accelerate, deepspeed, none" in lines[0]


def test_a_launcher_missing_here_stops_a_local_run_with_one_line(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local nodes run on this machine: `up` checks the launcher before anything starts."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setenv("PATH", str(empty))
    args = ["up", str(project / "train.py"), "--cloud", "local", "--gpus", "cpu:1"]
    result = runner.invoke(app, [*args, "--launcher", "deepspeed", "--dryrun", "--yes"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "deepspeed not found" in lines[0], result.output


def test_the_node_preflight_names_a_missing_launcher(tmp_path: Path) -> None:
    """On a cloud node the preflight stops before the launcher, naming it (exit 78)."""
    env = {
        **os.environ,
        "PATH": str(tmp_path),
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NUM_NODES": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "mncloud.doctor", "node", "--launcher", "accelerate",
         "--workdir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 78, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "preflight failed on node 0: launcher 'accelerate' is not installed on this node: "
        "pip install accelerate (in --setup or --requirements), or pick another --launcher"
    ]


# --------------------------------------------------------------------------- real 2-node runs

#: A script that joins the job however it was started and writes what it saw, per rank.
PROBE = """\
import json, os, sys
import torch
import torch.distributed as dist
out = os.environ["PROBE_OUT"]
if os.environ.get("PROBE_ACCELERATE"):
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    rank, world = acc.process_index, acc.num_processes
else:
    if "RANK" not in os.environ:  # --launcher none: one process per node
        os.environ.update(RANK=os.environ["NODE_RANK"], WORLD_SIZE=os.environ["NNODES"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": total.item(), "argv": sys.argv[1:]}, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["accelerate", "deepspeed", "none"])
def test_two_local_nodes_through_the_launcher(tmp_path: Path, launcher: str) -> None:
    if launcher != "none" and shutil.which(launcher, path=str(Path(sys.executable).parent)) is None:
        pytest.skip(f"{launcher} is not installed (pip install -e '.[dev]')")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname='p'\n")
    (project / "probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    envs = ["--env", f"PROBE_OUT={out}"]
    if launcher == "accelerate":
        envs += ["--env", "PROBE_ACCELERATE=1"]
    args = ["--lr", "3e-4", "$(touch PWNED)", "--num_processes", "9", "it's"]
    flags = ["--nodes", "2", "--gpus", "cpu:1", "--launcher", launcher, *envs]
    up(f"via-{launcher}", project / "probe.py", *flags, script_args=args)
    state = wait_final(f"via-{launcher}", timeout=300)
    assert state.state is RunState.SUCCEEDED, run_log(f"via-{launcher}")
    seen = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(s["rank"], s["world"], s["sum"]) for s in seen] == [(0, 2, 1.0), (1, 2, 1.0)]
    # deepspeed hands each process its --local_rank first (its convention); the rest is literal.
    prefix = [["--local_rank=0"]] if launcher == "deepspeed" else [[]]
    assert all(s["argv"] in [p + args for p in prefix] for s in seen), seen
    assert not (project / "PWNED").exists()
