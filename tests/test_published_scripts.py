"""Published scripts as they are (#61): the `--ckpt-dir` path given on their command line, a
resume given only by an argument (`--resume-args`), a restart told from a resume, and a
foreground `up` stopped by SIGTERM or SIGHUP as by Ctrl-C.

The scripts in tests/data are shaped like the published ones (same interfaces, written here):
`clm_shaped.py` as transformers' run_clm.py (`--output_dir`, `--resume_from_checkpoint PATH`),
`nanogpt_shaped.py` as nanoGPT's train.py (`--out_dir=`, `--init_from=resume`). Each runs on 2
local nodes with real torchrun and a real S3 server, preempted once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from mncloud import constants, layout
from mncloud.backends.local.resumecheck import restart_line, saved_line
from mncloud.spec.scriptargs import resume_shell_words, resume_words, script_shell_words
from tests.test_operate_more import cli as invoke
from tests.test_operate_more import one_line_error

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
CLM = DATA / "clm_shaped.py"
NANO = DATA / "nanogpt_shaped.py"


def _argv(words: list[str], **env: str) -> list[str]:
    """What bash makes of these shell words, with `env` set."""
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {' '.join(words)}"],
        env={"PATH": os.environ["PATH"], **env}, capture_output=True, check=True,
    )  # fmt: skip
    return out.stdout.decode().split("\0")[:-1]


# --------------------------------------------------------------------------- the words


def test_the_ckpt_dir_path_in_an_argument_is_the_nodes_folder() -> None:
    args = ["--output_dir", "/ckpt", "--logging_dir=/ckpt/logs", "/ckpt2", "/data/ckpt",
            "x /ckpt/a b", "it's", ""]  # fmt: skip
    words = script_shell_words(args, "/ckpt")
    node = "/runs/demo/nodes/node-1/ckpt-dir"
    assert _argv(words, MNCLOUD_CKPT_DIR=node) == [
        "--output_dir", node, f"--logging_dir={node}/logs", "/ckpt2", "/data/ckpt",
        f"x {node}/a b", "it's", "",
    ]  # fmt: skip
    assert _argv(words, MNCLOUD_CKPT_DIR="/ckpt") == args  # on a cloud: the same words
    assert _argv(script_shell_words(args, None)) == args


def test_resume_args_name_the_unit_only_where_asked() -> None:
    words = resume_words("--resume_from_checkpoint {ckpt} --x={ckpt}/a --init_from=resume", "/c")
    unit = "/c/checkpoint-40 & $HOME"  # no shell meaning survives
    assert _argv(resume_shell_words(words), MNCLOUD_RESUME_FROM=unit) == [
        "--resume_from_checkpoint", unit, f"--x={unit}/a", "--init_from=resume",
    ]  # fmt: skip
    assert resume_words("'--a {{literal}}'", "/c") == ["--a {{literal}}"]
    assert _argv(resume_shell_words(["--a {{literal}}"])) == ["--a {literal}"]
    assert resume_words(None, None) == [] and resume_words("  ", "/c") == []


@pytest.mark.catalog
@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        ([], ("--resume-args", "needs --ckpt-dir")),
        (["--ckpt-dir", "/ckpt"], ("unknown placeholder {step}", "mncloud knows {ckpt}")),
    ],
)
def test_bad_resume_args_are_one_line_and_exit_2(flags: list[str], needles: tuple[str]) -> None:
    result = invoke("render", str(CLM), "--cloud", "local", "--gpus", "cpu:1", *flags,
                    "--resume-args", "--resume_from_checkpoint {step}")  # fmt: skip
    one_line_error(result, *needles)


@pytest.mark.catalog
def test_the_rendered_task_adds_resume_args_only_with_a_committed_unit() -> None:
    result = invoke("render", str(CLM), "--cloud", "local", "--gpus", "cpu:1", "--ckpt-dir",
                    "/ckpt", "--resume-args", "--resume_from_checkpoint {ckpt}", "--",
                    "--output_dir", "/ckpt")  # fmt: skip
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert '--output_dir "$MNCLOUD_CKPT_DIR"' in text
    assert 'resume_args=( --resume_from_checkpoint "$MNCLOUD_RESUME_FROM" )' in text
    assert '${resume_args[@]+"${resume_args[@]}"} &' in text


def test_a_restart_is_told_from_a_resume() -> None:
    assert restart_line(2, "checkpoint-40", 40, 41) is None
    assert restart_line(2, "checkpoint-40", None, 41) is None
    said = "attempt 2 started from scratch although checkpoint-40 was committed"
    assert restart_line(2, "checkpoint-40", 0, 1) == said
    assert restart_line(2, "checkpoint-40", None, 1) == said
    assert restart_line(3, "checkpoint-40", 20, 21) == (
        "attempt 3 started from step 20 although checkpoint-40 was committed"
    )
    assert restart_line(2, "ckpt.pt", None, 1) == (
        "attempt 2 started from scratch although ckpt.pt was committed"
    )
    assert restart_line(2, "ckpt.pt", None, 11) is None  # no step in its name: only 0 is sure
    assert saved_line(12, None) == "newest complete checkpoint: step 12"
    assert saved_line(None, "checkpoint-40") == "newest committed --ckpt-dir unit: checkpoint-40"
    assert saved_line(None, "") == "newest committed --ckpt-dir unit: none"


def test_the_site_hook_joins_the_trainers_processes_on_a_cpu_only_node(tmp_path: Path) -> None:
    """run_clm.py gives no `--use_cpu`: on a CPU-only node under torchrun the Trainer then
    trains each process alone (world 1, NOT_PARALLEL). The local nodes' site hook makes them
    one job, as GPUs do; without the hook they stay alone."""
    pytest.importorskip("transformers")
    from mncloud.backends.local.nodes import site_hook

    probe = tmp_path / "probe.py"
    probe.write_text(
        "from transformers import HfArgumentParser, TrainingArguments\n"
        "(a,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
        "import os; os.write(1, f'world {a.world_size} {a.parallel_mode.value}\\n'.encode())\n"
    )
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc_per_node=2", str(probe), "--output_dir", str(tmp_path)]

    def worlds(pythonpath: str) -> set[str]:
        env = {**os.environ, "PYTHONPATH": pythonpath, "CUDA_VISIBLE_DEVICES": ""}
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return {line for line in out.stdout.splitlines() if line.startswith("world")}

    hooked = os.pathsep.join([str(site_hook(tmp_path / "hook")), str(REPO)])
    assert worlds(hooked) == {"world 2 distributed"}
    assert worlds(str(REPO)) == {"world 1 not_parallel"}


# --------------------------------------------------------------------------- local runs

ECHO = """import os, sys
resume = os.environ.get("MNCLOUD_RESUME_FROM")
print("argv", sys.argv[1:], "env", os.environ["OUT"], "resume", resume, flush=True)
"""


@pytest.mark.catalog
def test_a_local_node_sees_its_own_folder_where_the_ckpt_dir_path_is_given(
    tmp_path: Path,
) -> None:
    """`--ckpt-dir /ckpt -- --out /ckpt/x` and `--env OUT=/ckpt/o` on 2 local nodes: each node
    gets its own folder in both (on a cloud, /ckpt is that folder)."""
    from tests.test_local import run_log, up, wait_final

    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    up("echo", script, "--nodes", "2", "--gpus", "cpu:1", "--launcher", "none", "--ckpt-dir",
       "/ckpt", "--env", "OUT=/ckpt/o", "--resume-args", "--from {ckpt}",
       script_args=["--out", "/ckpt/x"])  # fmt: skip
    assert wait_final("echo").state.value == "SUCCEEDED", run_log("echo")
    log = run_log("echo")
    for node in (0, 1):
        own = layout.run_dir("echo") / "nodes" / f"node-{node}" / "ckpt-dir"
        expect = f"argv ['--out', '{own}/x'] env {own}/o resume None"
        assert f"[node {node}] {expect}" in log, log


def _tagged(token: str) -> list[psutil.Process]:
    """Every live process of a local run (its node tag in the environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(constants.LOCAL_NODE_TAG_ENV, "").startswith(token):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.catalog
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_a_foreground_up_stops_the_run(sig: signal.Signals) -> None:
    """`timeout 150 mncloud up …` (SIGTERM) or a closed terminal (SIGHUP): the run stops as
    with Ctrl-C, nothing of it left running, the command exits 128 + the signal."""
    from mncloud.backends.local.state import load_launch, load_state

    name = f"sig{sig.value}"
    script = REPO / "examples" / "train_ddp.py"
    mncloud = Path(sys.executable).parent / "mncloud"
    cmd = [str(mncloud), "up", str(script), "--cloud", "local", "--nodes", "2", "--gpus",
           "cpu:1", "--name", name, "--yes", "--", "--steps", "1000000"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "100"})  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until training runs
            if "[node 0 rank 0]" in line and "step" in line:
                break
        folder = layout.run_dir(name)
        token = load_launch(folder).token
        assert _tagged(token), "the run has processes while it trains"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig.value, out
    assert f"{sig.name}: stopping {name}" in out and "Traceback" not in out, out
    state = load_state(folder)
    assert state.state.value == "CANCELLED" and state.state.is_final, state.detail
    assert "process(es) of the run gone" in out, out
    assert _tagged(token) == []


@pytest.mark.slow
@pytest.mark.catalog
def test_a_signal_during_the_reference_run_stops_it_too() -> None:
    """The demo's summary runs the task once more for its reference; SIGTERM then stops that
    run too (none of its processes left), and `up` exits 143."""
    from mncloud.backends.local.lifecycle import REFERENCE_DIR
    from mncloud.backends.local.state import load_launch, load_state
    from tests.test_local import wait_until

    script = REPO / "examples" / "train_ddp.py"
    mncloud = Path(sys.executable).parent / "mncloud"
    cmd = [str(mncloud), "up", str(script), "--cloud", "local", "--nodes", "2", "--gpus",
           "cpu:1", "--name", "refsig", "--recovery", "gang", "--yes",
           "--chaos-preempt-after", "2s", "--", "--steps", "400"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "100"})  # fmt: skip
    ref = layout.run_dir("refsig") / REFERENCE_DIR
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the reference run trains
            if "once more without chaos" in line:
                break
        wait_until(lambda: (ref / "launch.json").exists(), 120, "the reference run's folder")
        token = load_launch(ref).token
        wait_until(lambda: _tagged(token) or proc.poll() is not None, 120, "its processes")
        assert proc.poll() is None, "up ended before its reference run started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "reference stopped" in out, out
    assert load_state(layout.run_dir("refsig")).state.value == "SUCCEEDED"
    left = _tagged(token)
    assert left == [], [(p.pid, p.cmdline(), p.ppid()) for p in left]


# --------------------------------------------------------------------------- preempted once


def _newest_step(run: dict[str, Any]) -> int:
    newest = run["at_kill"]["newest"]
    assert newest is not None, run["at_kill"]
    return int(newest.step)


CLM_ARGS = ["--output_dir", "/ckpt", "--max_steps", "80", "--save_steps", "10",
            "--per_device_train_batch_size", "8", "--learning_rate", "1e-3", "--seed", "0",
            "--data_seed", "0", "--full_determinism", "--save_on_each_node", "--report_to",
            "none", "--compute_ms", "250"]  # fmt: skip
RESUME_CLM = ("--resume-args", "--resume_from_checkpoint {ckpt}")


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """run_clm.py's interface, preempted once after checkpoint-30 was committed."""
    pytest.importorskip("transformers")
    from tests.test_trainers import _committed, _preempted_once

    return _preempted_once(tmp_path_factory, s3_server, "clm", CLM, CLM_ARGS, _committed(30),
                           "model.safetensors", flags=RESUME_CLM)  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_a_run_clm_shaped_script_resumes_from_its_newest_unit_by_argument(
    clm_run: dict[str, Any],
) -> None:
    """`--ckpt-dir /ckpt -- --output_dir /ckpt` and `--resume-args '--resume_from_checkpoint
    {ckpt}'`: the first attempt starts clean, the relaunch resumes from the newest committed
    checkpoint the kill left, and the run ends on the uninterrupted run's weights."""
    state, log = clm_run["state"], clm_run["log"]
    assert state.state.value == "SUCCEEDED", log
    assert (state.restarts, state.preemptions) == (1, 1)
    newest = _newest_step(clm_run)
    assert [s.get("resumed_from") for s in clm_run["starts"]] == [0, newest], clm_run["starts"]
    assert f"newest committed --ckpt-dir unit: checkpoint-{newest}" in log, log
    assert "adding --resume-args --resume_from_checkpoint" in log
    assert "started from scratch" not in log
    assert clm_run["final"] == clm_run["reference"]


NANO_ARGS = ["--out_dir=/ckpt", "--max_iters=160", "--eval_interval=10", "--compute_ms=250"]


def _ckpt_pt_of_iter_30(uri: str) -> bool:
    import io

    import torch

    from tests.test_trainers import _bucket_file, _bucket_keys

    if "ckpt.pt" not in _bucket_keys(uri):
        return False
    try:
        return int(torch.load(io.BytesIO(_bucket_file(uri, "ckpt.pt")))["iter_num"]) >= 30
    except Exception:  # replaced while read
        return False


@pytest.fixture(scope="module")
def nano_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    from tests.test_trainers import _preempted_once

    return _preempted_once(tmp_path_factory, s3_server, "nano", NANO, NANO_ARGS,
                           _ckpt_pt_of_iter_30, "final.pt",
                           flags=("--resume-args", "--init_from=resume"))  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_a_nanogpt_shaped_script_resumes_with_init_from_resume(nano_run: dict[str, Any]) -> None:
    state, log = nano_run["state"], nano_run["log"]
    assert state.state.value == "SUCCEEDED", log
    assert (state.restarts, state.preemptions) == (1, 1)
    assert "newest committed --ckpt-dir unit: ckpt.pt" in log, log
    assert "[node 0 rank 0] resuming from iteration" in log, log
    assert log.count("adding --resume-args --init_from=resume") == 2  # each node, attempt 2
    assert nano_run["final"] == nano_run["reference"]


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The run_clm-shaped script without `--resume-args`, preempted once: it starts over."""
    pytest.importorskip("transformers")
    from mncloud.backends.local.figures import recovery_figures
    from mncloud.cli.follow import summary_table
    from mncloud.layout import run_dir
    from tests.servers import use_s3
    from tests.test_local import cli, run_log, up, wait_final, wait_until
    from tests.test_trainers import FLAGS, _committed

    home = tmp_path_factory.mktemp("scratch-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(home))
        use_s3(s3_server, mp)
        bucket = s3_server.make_bucket()
        up("scratch", CLM, *FLAGS, "--bucket", f"s3://{bucket}/exp", script_args=CLM_ARGS)
        uri = f"s3://{bucket}/exp/scratch"
        wait_until(lambda: _committed(20)(uri), 400, "checkpoint-20 in the bucket")
        cli("chaos", "preempt", "scratch", "--node", "1")
        state = wait_final("scratch", timeout=400)
        status = invoke("status", "scratch")
        figures = recovery_figures(run_dir("scratch"))
        from rich.console import Console

        console = Console(width=200, record=True)
        console.print(summary_table_of(figures, summary_table))
        return {"state": state, "log": run_log("scratch"), "status": status.stdout,
                "figures": figures, "summary": console.export_text()}  # fmt: skip


def summary_table_of(figures: Any, table: Any) -> Any:
    from mncloud.backends.base import RunProgress, RunState

    progress = RunProgress(name="scratch", state=RunState.SUCCEEDED, ended=True, attempt=2,
                           restarts=1, preemptions=1, step=None, started_at=None,
                           ended_at=None, detail="", figures=figures)  # fmt: skip
    return table(progress)


@pytest.mark.slow
@pytest.mark.catalog
def test_a_script_that_started_over_is_not_called_resumed(scratch_run: dict[str, Any]) -> None:
    """Without `--resume-args` run_clm.py trains from step 0 again: the log, `status` and the
    summary say so, naming the committed checkpoint it did not resume from."""
    state, log = scratch_run["state"], scratch_run["log"]
    assert state.state.value == "SUCCEEDED", log
    said = [line for line in log.splitlines() if "started from scratch although" in line]
    assert len(said) == 1 and "attempt 2 started from scratch although checkpoint-" in said[0]
    unit = said[0].split("although ")[1].removesuffix(" was committed")
    assert f"newest committed --ckpt-dir unit: {unit}" in log
    assert scratch_run["figures"].restarted == [said[0].split("] ", 1)[1]]
    assert scratch_run["figures"].resume_s == []
    assert "started from scratch although" in " ".join(scratch_run["status"].split())
    summary = scratch_run["summary"]
    assert "not resumed" in summary and "resumed in" not in summary, summary
