"""The preflight's all-reduce bandwidth test (`mncloud/doctor/bandwidth.py`): real node
processes over gloo on loopback, then a real local run whose figure reaches `status --json` and
the run record, and a `--min-bandwidth` above loopback's that refuses before training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mncloud.backends.base import RunState
from mncloud.doctor import bandwidth
from tests.servers import free_port
from tests.test_doctor import FAILED, finish, start_node, workdir
from tests.test_local import cli, run_log, run_series, up, wait_final

if TYPE_CHECKING:
    from tests.fakesky import FakeSky


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    # 1 GB in 1 s over 4 ranks: algbw 1 GB/s × 2·3/4.
    assert bandwidth.bus_bandwidth(10**9, 1.0, 4) == pytest.approx(1.5)
    assert bandwidth.bus_bandwidth(10**9, 1.0, 1) == 0.0


def test_loopback_is_reported_not_judged_a_cloud_fabric_far_below_warns() -> None:
    """A healthy local machine under other work (0.37 GB/s over loopback, 18 % of its nominal
    2 GB/s) shows no warning; the same share of a cloud fabric's expectation warns; a
    --min-bandwidth floor refuses either."""
    local = bandwidth.Bandwidth(2, "gloo", 0.37, expected_gbs=2.0,
                                fabric="loopback (local backend)")  # fmt: skip
    assert local.on_loopback and not local.short
    assert bandwidth.judge(local, None) == ([], [])
    assert "over loopback: this machine's shared CPUs, not a network (not judged)" in local.line()
    assert "expected" not in local.line()
    refused, _ = bandwidth.judge(local, 1.0)
    assert len(refused) == 1 and "below --min-bandwidth 1 GB/s" in refused[0]
    cloud = bandwidth.Bandwidth(2, "nccl", 2.2, expected_gbs=12.0, fabric="p5.48xlarge: AWS EFA")
    assert cloud.short and not cloud.on_loopback
    _, warned = bandwidth.judge(cloud, None)
    assert len(warned) == 1 and warned[0].startswith("preflight warning: ")
    assert "18% of the 12.00 GB/s expected for p5.48xlarge: AWS EFA" in warned[0]
    assert bandwidth.published(bandwidth.asdict(local)).line() == local.line()


def _pair(tmp_path: Path, *flags: str) -> list[tuple[int, str]]:
    port, wd = free_port(), workdir(tmp_path, "wd")
    env = {"GLOO_SOCKET_IFNAME": "lo", "MNCLOUD_RUN_ID": "r-1"}
    common = ("--bandwidth", "--timeout", "30", *flags)
    head = start_node(0, 2, port, wd, *common, env=env)
    member = start_node(1, 2, port, wd, *common, env=env)
    return finish(head, member, timeout=90)


@pytest.mark.slow
def test_two_nodes_measure_publish_the_figure_and_warn_far_below_the_expectation(
    tmp_path: Path,
) -> None:
    """One pair of node processes (torch in each, seconds): the figure measured and published,
    and a warning, not a refusal, when it is far below what the fabric should give."""
    bucket = f"file://{tmp_path / 'bucket'}"
    expect = ("--expect-busbw", "1e6", "--fabric", "AWS EFA")
    (rc0, err0), (rc1, err1) = _pair(tmp_path, "--bucket", bucket, *expect)
    assert (rc0, rc1) == (0, 0), err0 + err1
    assert "all-reduce bus bandwidth" in err0 and "between 2 nodes (gloo)" in err0
    figures = bandwidth.read(bucket, "r-1")
    assert figures is not None and figures["busbw_gbs"] > 0
    assert len(figures["sizes"]) == len(bandwidth.SIZES)
    assert (rc0, rc1) == (0, 0), err0
    warning = next(line for line in err0.splitlines() if line.startswith("preflight warning"))
    assert "of the 1000000.00 GB/s expected for AWS EFA" in warning
    assert "NCCL_SOCKET_IFNAME" in warning and "EFA not enabled" in warning


@pytest.mark.slow
def test_min_bandwidth_above_loopback_refuses_on_every_node(tmp_path: Path) -> None:
    (rc0, err0), (rc1, err1) = _pair(tmp_path, "--min-bandwidth", "1e6")
    assert rc0 == rc1 == FAILED
    for err in (err0, err1):
        (line,) = [x for x in err.splitlines() if x.startswith("preflight failed")]
        assert "below --min-bandwidth 1e+06 GB/s" in line


@pytest.mark.slow
def test_a_node_that_never_joins_fails_the_test_naming_it(tmp_path: Path) -> None:
    """The gang check passes, then node 1 dies before the all-reduce: node 0 names the
    process group it could not form; (a node unreachable earlier is the gang check's)."""
    port, wd = free_port(), workdir(tmp_path, "wd")
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    head = start_node(0, 2, port, wd, "--bandwidth", "--timeout", "5", env=env)
    member = start_node(1, 2, port, wd, "--timeout", "5", env=env)  # no test: never joins
    (rc0, err0), (rc1, _) = finish(head, member, timeout=60)
    assert rc0 == FAILED and rc1 == 0
    assert "preflight failed on node 0: the all-reduce bandwidth test could not run" in err0


@pytest.mark.slow
@pytest.mark.catalog
def test_local_run_shows_the_figure_in_status_and_record(tmp_path: Path) -> None:
    from mncloud.records.store import load_current

    (tmp_path / "pyproject.toml").write_text("[project]\nname='bw'\n")
    script = tmp_path / "hello.py"
    script.write_text("print('trained', flush=True)\n")
    up("bw", script, "--nodes", "2", "--gpus", "cpu:1")
    assert wait_final("bw").state is RunState.SUCCEEDED, run_log("bw")
    assert "all-reduce bus bandwidth" in run_log("bw")
    (status,) = json.loads(cli("status", "bw", "--json").output)
    figures = status["bandwidth"]
    assert figures["busbw_gbs"] > 0 and figures["fabric"] == "loopback (local backend)"
    assert load_current("bw").bandwidth == figures
    # `doctor --bandwidth RUN`: the test alone across the run's nodes, against its expectation.
    again = cli("doctor", "--bandwidth", "bw").output
    assert "all-reduce bus bandwidth" in again and "over loopback" in again
    assert "preflight warning" not in again and "preflight warning" not in run_log("bw")


@pytest.mark.slow
@pytest.mark.catalog
def test_min_bandwidth_above_loopback_refuses_before_training(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='bw'\n")
    script = tmp_path / "hello.py"
    script.write_text("print('trained', flush=True)\n")
    up("bwmin", script, "--nodes", "2", "--gpus", "cpu:1", "--min-bandwidth", "100000")
    assert wait_final("bwmin").state is RunState.FAILED
    log = run_log("bwmin")
    assert "below --min-bandwidth 100000 GB/s" in log
    assert "trained" not in log


# ----------------------------------------------------- a live cloud cluster (`up --cluster`)


@pytest.mark.slow
@pytest.mark.catalog
def test_doctor_measures_a_live_cloud_cluster_with_sky_exec(
    tmp_path: Path, fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`doctor --bandwidth` on a `--cluster` run: `sky.exec` (the fake bound to its real
    signature) hands the cluster a task whose `run` is the test alone; the "cluster" runs it
    on two real local node processes (gloo over loopback); node 0's line comes back through
    SkyPilot's job log. The launch's own figure is not replaced; `--min-bandwidth` refuses."""
    from sky.skylet import job_lib

    from tests.skynodes import cluster_jobs

    (tmp_path / "pyproject.toml").write_text("[project]\nname='bw'\n")
    (tmp_path / "train.py").write_text("print('trained')\n")
    monkeypatch.chdir(tmp_path)
    port = str(free_port())
    up_args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "2", "--cloud", "aws", "--yes"]
    result = _invoke(*up_args, "--cluster", "--name", "dev", "--master-port", port, "--detach")
    assert result.exit_code == 0, result.output
    fake_sky.clusters["dev"]["jobs"][1] = job_lib.JobStatus.SUCCEEDED  # training is over
    fake_sky.on_job = cluster_jobs(fake_sky)  # CPU "nodes": no GPUs to count

    measured = _invoke("doctor", "--bandwidth", "dev")
    assert measured.exit_code == 0, measured.output
    # Loopback against p5's EFA expectation (the plan's choice, as rendered): a warning.
    line = next(x for x in measured.output.splitlines() if "all-reduce bus bandwidth" in x)
    assert line.startswith("preflight warning: ") and "between 2 nodes (gloo)" in line
    assert "expected for p5.48xlarge: AWS EFA" in line and "likely causes" in line
    ((args, kwargs),) = fake_sky.called("exec")
    assert kwargs == {"cluster_name": "dev"}
    sent = args[0]
    assert (
        "--bandwidth" in sent.run
        and "torchrun" not in sent.run
        and f"MASTER_PORT={port}" in sent.run
    )
    assert "MNCLOUD_RUN_ID" not in sent.envs and sent.workdir is None  # the run's figure stays
    assert fake_sky.clusters["dev"]["jobs"][2] == job_lib.JobStatus.SUCCEEDED

    refused = _invoke("doctor", "--bandwidth", "dev", "--min-bandwidth", "100000")
    assert refused.exit_code == 1
    assert "preflight failed on node 0" in refused.output
    assert "below --min-bandwidth 100000 GB/s" in refused.output


@pytest.mark.catalog
def test_doctor_bandwidth_of_a_managed_job_says_where_the_figure_is(
    tmp_path: Path, fake_sky: FakeSky, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='bw'\n")
    (tmp_path / "train.py").write_text("print('trained')\n")
    monkeypatch.chdir(tmp_path)
    up_args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "2", "--cloud", "aws", "--yes"]
    assert _invoke(*up_args, "--name", "job", "--recovery", "gang", "--detach").exit_code == 0
    result = _invoke("doctor", "--bandwidth", "job")
    assert result.exit_code == 2
    assert "managed job" in result.output and "mncloud status job" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not fake_sky.called("exec")


def _invoke(*args: str) -> Any:
    from typer.testing import CliRunner

    from mncloud.cli import app

    return CliRunner().invoke(app, list(args))


# ------------------------------------------------ node recovery (the default with Replicas)


def _up_default(name: str, *flags: str, steps: int = 3) -> None:
    """`up` of `examples/train_ddp.py` (it uses Replicas) on 2 local nodes, with no --recovery:
    node recovery is the default."""
    from tests.test_local import EXAMPLE

    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", name, "--detach", "--yes"]
    cli(*args, "--nodes", "2", "--gpus", "cpu:1", *flags, "--", "--steps", str(steps))


@pytest.mark.slow
@pytest.mark.catalog
def test_node_recovery_measures_the_fabric_before_the_first_quorum() -> None:
    """The nodes that start together meet and measure (one rank per node) before torchft's
    first quorum; the figure reaches `status --json`."""
    _up_default("bwnode")
    assert wait_final("bwnode").state is RunState.SUCCEEDED, run_log("bwnode")
    log = run_log("bwnode")
    assert "between 2 nodes (gloo)" in log[log.index("all-reduce bus bandwidth") :]
    (status,) = json.loads(cli("status", "bwnode", "--json").output)
    assert status["recovery"] == "node"
    assert status["bandwidth"]["busbw_gbs"] > 0 and status["bandwidth"]["nodes"] == 2


@pytest.mark.slow
@pytest.mark.catalog
def test_node_recovery_min_bandwidth_refuses_before_the_first_step() -> None:
    _up_default("bwnodemin", "--min-bandwidth", "1000000")
    final = wait_final("bwnodemin")
    log = run_log("bwnodemin")
    assert final.state is RunState.FAILED, log
    refused = [x for x in log.splitlines() if "preflight failed" in x]
    assert refused and all("below --min-bandwidth 1e+06 GB/s" in x for x in refused), log
    assert "all-reduce bus bandwidth" in refused[0]  # names the figure it measured
    assert run_series("bwnodemin").steps == []  # no rank ever stepped


# ------------------------------- a cloud job group (node recovery): the nodes meet in the bucket

GROUP_SCRIPT = "from mncloud.train import Replicas\nreplicas = Replicas({})\n"
STARTS = "TRAINING WOULD START"


def _group_nodes(project: Path, bucket: str, run_id: str, **flags: Any) -> list[dict[str, Any]]:
    """The node tasks of a rendered 2-node job group (node recovery on AWS)."""
    import yaml

    from mncloud.render import render
    from mncloud.request import build_spec

    (project / "train.py").write_text(GROUP_SCRIPT)
    spec = build_spec(
        project / "train.py", recovery="node", gpus="H100:8", nodes=2, name="llm",
        bucket=bucket, master_port=free_port(), **flags,
    )  # fmt: skip
    _, _, *nodes = [d for d in yaml.safe_load_all(render(spec, run_id=run_id).yaml_text) if d]
    return nodes


def _start_group_node(node: dict[str, Any], workdir: Path) -> Any:
    """A node task's rendered `run` up to the launcher, as SkyPilot runs it on a single-node
    cluster of its own (its own address, rank 0 of 1), with no GPUs (SKYPILOT_NUM_GPUS_PER_NODE
    0) and gloo on loopback."""
    import os
    import subprocess
    import sys

    run = node["run"]
    script = run[: run.index("# --recovery node: each node is a replica group")]
    env = {
        **os.environ,
        **{k: str(v) for k, v in node["envs"].items()},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "SKYPILOT_TASK_ID": node["name"],
        "GLOO_SOCKET_IFNAME": "lo",
    }
    env.pop("NCCL_SOCKET_IFNAME", None)
    return subprocess.Popen(
        ["bash", "-c", f"{script}\necho '{STARTS}'"], cwd=workdir, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _outputs(*procs: Any) -> list[tuple[int, str]]:
    try:
        return [(p.communicate(timeout=120)[0], p.returncode)[::-1] for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.slow
@pytest.mark.catalog
def test_job_group_nodes_meet_in_the_bucket_and_measure(project: Path, s3_env: Any) -> None:
    """Two node tasks of a rendered job group, as two local processes over a real S3 server:
    node 0 publishes where to meet, node 1 finds it there, they measure one rank per node and
    node 0 publishes the figure where `status` reads it; a node SkyPilot recovers alone later
    finds the verdict and checks itself alone."""
    from mncloud.doctor import meeting
    from mncloud.storage import CheckpointStore

    bucket = f"s3://{s3_env.make_bucket()}"
    nodes = _group_nodes(project, bucket, "r-1")
    (rc0, out0), (rc1, out1) = _outputs(*(_start_group_node(n, project) for n in nodes))
    assert (rc0, rc1) == (0, 0), out0 + out1
    assert "between 2 nodes (gloo)" in out0 and STARTS in out0 and STARTS in out1
    assert "preflight ok on node 0/2" in out0 and "preflight ok on node 1/2" in out1
    figures = bandwidth.read(f"{bucket}/llm", "r-1")  # what `status --json` shows
    assert figures is not None and figures["busbw_gbs"] > 0 and figures["nodes"] == 2
    note = CheckpointStore(f"{bucket}/llm").get_note(meeting.NOTE, meeting.Meeting)
    assert note is not None and (note.launch, note.verdict) == ("r-1", "passed")
    assert note.address == "127.0.0.1" and "KEY" not in note.model_dump_json().upper()

    ((rc, out),) = _outputs(_start_group_node(nodes[1], project))  # node 1 recovered alone
    assert rc == 0 and "preflight ok on node 1/1" in out and "the gang met already" in out
    assert "bus bandwidth" not in out and STARTS in out


@pytest.mark.slow
@pytest.mark.catalog
def test_job_group_min_bandwidth_refuses_before_training(project: Path, s3_env: Any) -> None:
    """`--min-bandwidth` above loopback's figure on a job group: both nodes refuse before the
    launcher, naming the figure (a retry in that launch repeats the refusal: the test below)."""
    bucket = f"s3://{s3_env.make_bucket()}"
    nodes = _group_nodes(project, bucket, "r-2", min_bandwidth=1e6)
    results = _outputs(*(_start_group_node(n, project) for n in nodes))
    for rc, out in results:
        assert rc == FAILED and STARTS not in out, out
        assert "below --min-bandwidth 1e+06 GB/s" in out


def test_a_meeting_of_another_launch_is_not_joined(tmp_path: Path) -> None:
    """Only this launch's meeting is joined; a failed verdict is repeated to a retry, whose
    node 0 does not open a second meeting."""
    from mncloud.doctor import meeting
    from mncloud.storage import CheckpointStore

    store = CheckpointStore(f"file://{tmp_path / 'bucket'}/llm")
    opened = meeting.join(store, "r-1", 0, 2, "10.0.0.5", 29500)
    assert (opened.nodes, opened.master, opened.refused) == (2, "10.0.0.5", [])
    with pytest.raises(TimeoutError, match="node 0 published no meeting point"):
        meeting.join(store, "r-2", 1, 2, "10.0.0.6", 29500, timeout=0, sleep=lambda _: None)
    member = meeting.join(store, "r-1", 1, 2, "10.0.0.6", 29500, timeout=0)
    assert (member.nodes, member.master, member.port) == (2, "10.0.0.5", 29500)
    meeting.close(store, "r-1", ["preflight failed on node 1: slow"])
    retry = meeting.join(store, "r-1", 0, 2, "10.0.0.7", 29500)
    assert retry.refused == ["preflight failed on node 1: slow"]
    assert meeting.launch_id({"SKYPILOT_MANAGED_JOB_ID": "7"}) == "managed-job-7"
