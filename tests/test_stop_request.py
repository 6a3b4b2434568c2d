"""A stop request in the bucket (`mncloud down` of a cloud run): written, read, stale, cleared,
on every bucket kind; and a training process that reads one saves its step and exits 115."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mncloud import constants
from mncloud.storage import CheckpointStore
from mncloud.storage.stoprequest import (
    STALE_S,
    STOP_REQUEST,
    clear_stop_request,
    read_stop_request,
    request_stop,
)
from mncloud.storage.url import join_key

# A node of a cloud run: a periodic interval so long that only a notice's save commits a step.
NODE = """
import logging, time, torch
from mncloud.train import CheckpointManager
logging.basicConfig(level=logging.INFO, format="%(message)s")
state = {"model": torch.nn.Linear(4, 4), "step": 0}
ckpt = CheckpointManager(interval_steps=100000, keep=2)
print("ready", flush=True)
for step in range(1, 10**7):
    state["step"] = step
    time.sleep(0.01)
    ckpt.maybe_save(step, state)
"""


def test_a_request_is_read_until_cleared_and_a_stale_one_is_not(bucket_uri: str) -> None:
    store = CheckpointStore(bucket_uri)
    assert read_stop_request(store) is None
    clear_stop_request(store)  # nothing to clear: no error
    asked = request_stop(store, 30, "mncloud down")
    seen = read_stop_request(store)
    assert seen == asked and seen.deadline - seen.at == 30 and seen.by == "mncloud down"
    assert read_stop_request(store, now=asked.deadline + STALE_S + 1) is None  # left over
    clear_stop_request(store)
    assert read_stop_request(store) is None
    store.bucket.put_bytes(join_key(store.prefix, STOP_REQUEST), b"{not json")
    assert read_stop_request(store) is None  # unreadable: no request, never a crash


def node_env(uri: str, tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        **{
            constants.CKPT_URI_ENV: uri,
            constants.PREEMPTION_WATCH_ENV: "1",
            constants.METADATA_PROTOCOL_ENV: "none",  # no cloud metadata: the bucket only
            constants.STOP_POLL_ENV: "0.2",
            constants.PREEMPT_MARKER_ENV: str(tmp_path / "marker"),
        },
    )


@pytest.mark.slow
def test_a_node_that_reads_a_request_saves_its_step_and_exits(
    bucket_uri: str, tmp_path: Path
) -> None:
    node = subprocess.Popen(
        [sys.executable, "-c", NODE], env=node_env(bucket_uri, tmp_path), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert node.stdout is not None and node.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # some steps, none committed (the interval is never reached)
    store = CheckpointStore(bucket_uri)
    assert store.latest()[0] is None
    request_stop(store, 30, "mncloud down")
    _, err = node.communicate(timeout=120)
    assert node.returncode == constants.PREEMPTED_EXIT_CODE, err
    assert "preemption notice from stop-request (mncloud down)" in err
    step, _ = store.latest()
    assert step is not None and step > 1
    assert f"checkpoint step {step} committed for the preemption" in err
