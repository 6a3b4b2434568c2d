"""Preflight: real node processes meeting on a real port, broken on purpose; laptop checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import doctor
from tests.servers import free_port

FAILED = doctor.PREFLIGHT_FAILED_EXIT_CODE


def workdir(tmp_path: Path, name: str, code: str = "print('train')\n") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(code)
    return folder


def start_node(
    rank: int, nodes: int, port: int, wd: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    node_env = {
        **os.environ,
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * nodes),
        "MASTER_ADDR": "127.0.0.1",
        **(env or {}),
    }
    node_env.pop("NCCL_SOCKET_IFNAME", None)
    cmd = [sys.executable, "-m", "mncloud.doctor", "node", "--port", str(port)]
    cmd += ["--workdir", str(wd), *extra]
    return subprocess.Popen(cmd, env=node_env, stderr=subprocess.PIPE, text=True)


def finish(*procs: subprocess.Popen[str], timeout: float = 30) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        _, err = proc.communicate(timeout=timeout)
        out.append((proc.returncode, err))
    return out


def test_two_nodes_agree(tmp_path: Path) -> None:
    port = free_port()
    wd = workdir(tmp_path, "wd")
    data = tmp_path / "data"
    data.mkdir()
    bucket = f"file://{tmp_path / 'bucket'}"
    common = ("--require-path", str(data), "--bucket", bucket, "--timeout", "20")
    t0 = time.monotonic()
    head = start_node(0, 2, port, wd, *common)
    member = start_node(1, 2, port, wd, *common)
    (rc0, err0), (rc1, err1) = finish(head, member)
    assert (rc0, rc1) == (0, 0), err0 + err1
    assert "preflight ok on node 0/2" in err0 and "all nodes agree" in err1
    assert time.monotonic() - t0 < 15
    # The port is free again for torchrun.
    import socket

    socket.create_server(("", port)).close()


def test_mismatched_code_on_one_node_fails_both_fast(tmp_path: Path) -> None:
    port = free_port()
    head = start_node(0, 2, port, workdir(tmp_path, "a"), "--timeout", "20")
    member = start_node(1, 2, port, workdir(tmp_path, "b", "print('stale')\n"), "--timeout", "20")
    t0 = time.monotonic()
    (rc0, err0), (rc1, err1) = finish(head, member)
    assert time.monotonic() - t0 < 10  # not the 20 s deadline
    assert rc0 == rc1 == FAILED
    for err in (err0, err1):
        assert err.startswith("preflight failed on node 1: different code (workdir hash ")


def test_missing_path_on_one_node(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    data.mkdir()
    wd = workdir(tmp_path, "wd")
    head = start_node(0, 2, port, wd, "--require-path", str(data))
    member = start_node(1, 2, port, wd, "--require-path", str(tmp_path / "missing"))
    (rc0, err0), (rc1, err1) = finish(head, member)
    assert rc0 == rc1 == FAILED
    line = f"preflight failed on node 1: required path {tmp_path / 'missing'} does not exist"
    assert err0.strip() == line and err1.strip() == line


def test_wrong_port_names_the_unreachable_node(tmp_path: Path) -> None:
    port, wrong = free_port(), free_port()
    wd = workdir(tmp_path, "wd")
    head = start_node(0, 2, port, wd, "--timeout", "3")
    member = start_node(1, 2, wrong, wd, "--timeout", "3")
    t0 = time.monotonic()
    (rc0, err0), (rc1, err1) = finish(head, member)
    assert time.monotonic() - t0 < 10
    assert rc0 == rc1 == FAILED
    assert f"preflight failed on node 1: did not reach the master on port {port}" in err0
    assert f"preflight failed on node 1: cannot reach the master 127.0.0.1:{wrong}" in err1


def test_a_bucket_that_does_not_answer_is_a_storage_outage(tmp_path: Path) -> None:
    """Transient failures past the retry budget are an outage; a refusal is not."""
    from mncloud.doctor.checks import OUTAGE_WORDS, outage_only
    from mncloud.storage import set_simulated_outage

    uri = f"file://{tmp_path / 'bucket'}"
    set_simulated_outage(uri, True)
    down = doctor.check_bucket(uri, node=1, retry_seconds=0.2)
    assert not down.ok and down.detail.startswith(f"{OUTAGE_WORDS} ")
    assert doctor.check_path(uri, retry_seconds=0.2).detail.startswith(OUTAGE_WORDS)
    set_simulated_outage(uri, False)
    assert doctor.check_bucket(uri, retry_seconds=0.2).ok
    assert outage_only([down.line()]) and not outage_only([])
    assert not outage_only([down.line(), "preflight failed on node 0: required path x …"])


@pytest.mark.slow
def test_nodes_whose_bucket_is_down_exit_as_an_outage(tmp_path: Path) -> None:
    """Both nodes of a gang whose bucket is down exit STORAGE_OUTAGE_EXIT_CODE (75), not 78;
    an outage beside a broken setup is the setup's failure (78)."""
    from mncloud import constants
    from mncloud.storage import set_simulated_outage

    bucket = f"file://{tmp_path / 'bucket'}"
    set_simulated_outage(bucket, True)
    wd = workdir(tmp_path, "wd")
    for missing, code in (("", constants.STORAGE_OUTAGE_EXIT_CODE), ("nothing", FAILED)):
        extra = ("--require-path", str(tmp_path / missing)) if missing else ()
        port = free_port()
        nodes = [start_node(r, 2, port, wd, "--bucket", bucket, *extra) for r in (0, 1)]
        for rc, err in finish(*nodes):
            assert rc == code, err
            assert "preflight failed on node 1: storage outage: " in err, err


def test_port_taken_on_head_and_node_count_mismatch(tmp_path: Path) -> None:
    import socket

    wd = workdir(tmp_path, "wd")
    with socket.create_server(("", 0)) as busy:
        taken = busy.getsockname()[1]
        ((rc, err),) = finish(start_node(0, 2, taken, wd, "--timeout", "5"))
    assert rc == FAILED and f"cannot listen on rendezvous port {taken}" in err
    port = free_port()
    head = start_node(0, 2, port, wd)
    member = start_node(1, 3, port, wd)  # this node believes in 3 nodes
    (rc0, err0), (_rc1, err1) = finish(head, member)
    assert rc0 == FAILED and "node 1: it expects 3 nodes, node 0 expects 2" in err0
    assert "it expects 3 nodes" in err1


def test_member_joining_a_running_job_passes(tmp_path: Path) -> None:
    import socket

    wd = workdir(tmp_path, "wd")
    with socket.create_server(("127.0.0.1", 0)) as store:  # a torchrun store says nothing
        port = store.getsockname()[1]
        proc = start_node(1, 2, port, wd, "--timeout", "3")
        ((rc, err),) = finish(proc)
    assert rc == 0 and "a running job" in err


def test_gpus_counted_by_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert doctor.check_gpus(2, 0).ok
    bad = doctor.check_gpus(8, 3)
    assert bad.line() == "preflight failed on node 3: 2 GPU(s) visible (nvidia-smi), 8 requested"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert doctor.check_gpus(1).ok
    assert doctor.check_gpus(0).ok  # CPU task


def test_nccl_ifname() -> None:
    have = doctor.interfaces()
    assert "lo" in have
    assert doctor.check_ifname(None).ok
    assert doctor.check_ifname("lo").ok
    assert doctor.check_ifname("l").ok  # NCCL matches prefixes
    assert not doctor.check_ifname("=l").ok  # '=' asks for the exact name
    assert doctor.check_ifname("^docker").ok
    bad = doctor.check_ifname("ens9999", node=1)
    assert not bad.ok and "matches no network interface" in bad.detail and "lo" in bad.detail


def test_code_hash_ignores_outputs(tmp_path: Path) -> None:
    wd = workdir(tmp_path, "wd")
    before = doctor.code_hash(wd)
    (wd / "run.log").write_text("step 1\n")
    (wd / "__pycache__").mkdir()
    (wd / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (wd / "ckpt").mkdir()
    (wd / "ckpt" / "shard.pt").write_bytes(b"w")
    assert doctor.code_hash(wd) == before
    (wd / "conf.yaml").write_text("lr: 1\n")
    assert doctor.code_hash(wd) != before
    assert not doctor.check_code_hash(before, "deadbeef", 0).ok


@pytest.mark.slow
def test_bucket_and_paths(bucket_uri: str) -> None:
    ok = doctor.check_bucket(bucket_uri)
    assert ok.ok, ok.detail
    from mncloud.storage import open_bucket

    bucket, prefix = open_bucket(bucket_uri)
    assert bucket.list(prefix) == []  # the probe is gone
    bucket.put_bytes(f"{prefix}/data/shard-0".lstrip("/"), b"x")
    assert doctor.check_path(f"{bucket_uri}/data").ok
    missing = doctor.check_path(f"{bucket_uri}/nothing-here", node=2)
    assert missing.line().startswith("preflight failed on node 2: required path")


def test_missing_bucket_fails(s3_env) -> None:  # type: ignore[no-untyped-def]
    check = doctor.check_bucket("s3://no-such-bucket-mncloud/x", retry_seconds=1)
    assert not check.ok and "no-such-bucket-mncloud" in check.detail


def test_credentials_timeout_and_advice() -> None:
    def probe(cloud: str) -> tuple[bool, str | None]:
        if cloud == "aws":
            return False, "AWS credentials are not set. Run the following commands:\n" + (
                "      $ aws configure\n      $ aws configure list"
            )
        if cloud == "gcp":
            time.sleep(30)
        return True, None

    t0 = time.monotonic()
    checks = doctor.check_credentials(["aws", "gcp", "lambda", "local"], timeout=1, probe=probe)
    assert time.monotonic() - t0 < 25  # not the 30 s the gcp probe sleeps
    by = {c.name: c for c in checks}
    assert set(by) == {"credentials aws", "credentials gcp", "credentials lambda"}
    assert by["credentials aws"].detail == (
        "aws: AWS credentials are not set — run `aws configure` (then `sky check`)"
    )
    assert "timed out after 1s" in by["credentials gcp"].detail
    assert by["credentials lambda"].ok


def test_cli_doctor(tmp_path: Path) -> None:
    from mncloud.cli import app

    bucket = f"file://{tmp_path / 'bucket'}"
    result = CliRunner().invoke(
        app, ["doctor", "--bucket", bucket, "--require-path", "/data/train", "--json"]
    )
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        app, ["doctor", "--require-path", f"file://{tmp_path / 'nope'}", "--cloud", "local"]
    )
    assert result.exit_code == 1
    assert "does not exist" in result.stdout


def test_doctor_bandwidth_of_a_one_node_local_run_checks_the_node_and_measures_nothing(
    tmp_path: Path,
) -> None:
    """`backends/local/netcheck.py` (`doctor --bandwidth RUN` on a local run), fast: its node
    processes start from the run's launch record; with one node there is no all-reduce to
    measure (no torch), so even a `--min-bandwidth` far above loopback's passes."""
    from mncloud import layout
    from mncloud.backends.local import netcheck
    from mncloud.backends.local.state import LocalLaunch, save_launch

    wd = workdir(tmp_path, "wd")
    folder = layout.run_dir("one")
    folder.mkdir(parents=True)
    save_launch(folder, LocalLaunch(
        name="one", token="t", task_id="x", num_nodes=1, procs_per_node=1, master_port=1,
        ckpt_uri=f"file://{tmp_path / 'ckpt'}", workdir=str(wd),
        run="mncloud-preflight --expect-busbw 2.0 --fabric 'loopback (local backend)'",
    ))  # fmt: skip
    for minimum in (None, 1e6):
        passed, lines = netcheck.measure("one", minimum, timeout=30)
        assert passed, lines
        assert len(lines) == 1 and lines[0].startswith("preflight ok on node 0/1"), lines
