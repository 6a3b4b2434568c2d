"""How a cloud run's nodes find torchft's lighthouse (`--recovery node` as a job group): the
address in the bucket (written, refreshed, stale, another launch's, unreadable) on every
bucket kind, and `python -m mncloud.train.lighthouse serve|find` end to end with torchft's
real lighthouse over a real S3 server: what `find` prints is a lighthouse that answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mncloud import constants
from mncloud.storage import CheckpointStore
from mncloud.storage.lighthouse import (
    LIGHTHOUSE_ADDRESS,
    STALE_S,
    publish_address,
    read_address,
)
from mncloud.storage.url import join_key
from tests.servers import S3Server, free_port

BIN = Path(sys.executable).parent


def test_the_address_of_this_launch_is_read_until_it_goes_stale(bucket_uri: str) -> None:
    store = CheckpointStore(bucket_uri)
    assert read_address(store, "r-1") is None
    published = publish_address(store, "http://10.0.3.7:29510", "r-1")
    assert read_address(store, "r-1") == published
    assert read_address(store, None) == published  # a run without an id takes any live one
    assert read_address(store, "r-2") is None  # another launch's lighthouse
    assert read_address(store, "r-1", now=published.at + STALE_S + 1) is None  # gone
    store.bucket.put_bytes(join_key(store.prefix, LIGHTHOUSE_ADDRESS), b"{not json")
    assert read_address(store, "r-1") is None  # unreadable: none, never a crash


def _env(uri: str, run_id: str) -> dict[str, str]:
    return dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # torchft_lighthouse
        SKYPILOT_NODE_IPS="127.0.0.1",
        **{constants.CKPT_URI_ENV: uri, constants.RUN_ID_ENV: run_id},
    )


def _find(env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mncloud.train.lighthouse", "find", "--timeout", str(timeout)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_nodes_find_the_live_lighthouse_through_the_bucket(s3_env: S3Server) -> None:
    uri = f"s3://{s3_env.make_bucket()}/llm"
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "mncloud.train.lighthouse", "serve", "--port", str(port),
         "--min-replicas", "1", "--heartbeat-timeout-ms", "5000", "--join-timeout-ms", "1000"],
        env=_env(uri, "r-1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        found = _find(_env(uri, "r-1"), timeout=60)
        assert found.returncode == 0, found.stderr
        url = found.stdout.strip()
        assert url == f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # the lighthouse it names answers (its status page)
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    assert response.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the published lighthouse never answered"
                time.sleep(0.5)
        # A node of another launch does not take this lighthouse: it waits, then one line.
        other = _find(_env(uri, "r-2"), timeout=3)
        assert other.returncode == 2 and other.stdout == ""
        assert len(other.stderr.strip().splitlines()) == 1
        assert "no live lighthouse" in other.stderr and "Traceback" not in other.stderr
    finally:
        serve.send_signal(signal.SIGTERM)  # passed on to the lighthouse: both end
        out, _ = serve.communicate(timeout=30)
    assert serve.returncode == 0, out  # stopped as told: no error for SkyPilot to retry


@pytest.mark.slow
def test_find_without_a_bucket_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != constants.CKPT_URI_ENV}
    found = _find(env, timeout=1)
    assert found.returncode != 0 and "needs --bucket" in found.stderr
    assert "Traceback" not in found.stderr


def test_find_in_process_without_a_bucket_then_on_an_empty_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`find` as the node's command runs it, in this process (fast: no interpreter to start):
    without a bucket, the one line naming the flag; on a bucket where no lighthouse published
    its address, exit 2 within the timeout, naming the bucket and where to look."""
    from mncloud.train import lighthouse

    monkeypatch.delenv(constants.CKPT_URI_ENV, raising=False)
    with pytest.raises(SystemExit) as refused:
        lighthouse.main(["find", "--timeout", "0"])
    assert refused.value.code != 0 and "needs --bucket" in str(refused.value.code)
    uri = f"file://{tmp_path / 'bucket'}"
    monkeypatch.setenv(constants.CKPT_URI_ENV, uri)
    monkeypatch.setenv(constants.RUN_ID_ENV, "r-1")
    assert lighthouse.main(["find", "--timeout", "0"]) == 2
    err = capsys.readouterr().err
    assert f"no live lighthouse published its address under {uri} within 0 s" in err, err
    assert "mncloud logs RUN" in err
