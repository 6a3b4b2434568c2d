"""Preemption notices: each cloud's metadata protocol from a real HTTP server on 127.0.0.1, a
real SIGTERM, and the coordinated emergency checkpoint (single process here; 2 nodes × 2 ranks
under the local backend in the slow test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mncloud import constants
from mncloud.backends.local.metadata import MetadataServer
from mncloud.train.preempt import Notice, PreemptionWatcher, protocols_from_env

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server() -> Any:
    with MetadataServer() as srv:
        yield srv


def watch(server: MetadataServer, protocol: str | None, node: int = 1) -> PreemptionWatcher:
    return PreemptionWatcher(
        [protocol] if protocol else None, base_url=server.url(node), poll_s=0.05, signals=()
    ).start()


@pytest.mark.parametrize("protocol", ["aws", "gcp", "azure"])
def test_watcher_sees_each_clouds_notice(server: MetadataServer, protocol: str) -> None:
    watcher = watch(server, protocol)
    try:
        # The node asked (AWS 404, GCP FALSE then a long-poll, Azure no events): no notice.
        assert server.wait_requests(1, protocol, 3 if protocol != "gcp" else 1)
        assert watcher.notice is None
        deadline = time.time() + 90
        server.announce(1, protocol, deadline)
        notice = watcher.wait(10)
        assert notice is not None and notice.source == protocol
        expected = notice.received + 30 if protocol == "gcp" else deadline
        assert abs(notice.deadline - expected) <= 1.0  # AWS and Azure give whole seconds
    finally:
        watcher.stop()


def test_notice_is_per_node_and_probed(server: MetadataServer) -> None:
    other, probing = watch(server, "aws", node=0), watch(server, None, node=2)
    try:
        server.announce(2, "gcp", time.time() + 30)
        notice = probing.wait(10)  # probed: GCP answers first with its Metadata-Flavor header
        assert notice is not None and notice.source == "gcp"
        count = server.requests[0, "aws"]
        assert server.wait_requests(0, "aws", count + 2) and other.notice is None
    finally:
        other.stop()
        probing.stop()


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/latest/meta-data/spot/instance-action", 401),
        ("PUT", "/latest/api/token", 400),
        ("GET", "/computeMetadata/v1/instance/preempted", 403),
        ("GET", "/metadata/scheduledevents?api-version=2020-07-01", 400),
    ],
)
def test_requests_without_the_protocols_header_are_refused(
    server: MetadataServer, method: str, path: str, code: int
) -> None:
    data = b"" if method == "PUT" else None
    req = urllib.request.Request(server.url(0) + path, method=method, data=data)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5)
    assert err.value.code == code


def test_a_client_that_went_away_prints_no_traceback(
    server: MetadataServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node killed mid-request (BrokenPipe, reset) is quiet; any other error still prints."""
    httpd = server._httpd
    for err in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
        try:
            raise err
        except ConnectionError:
            httpd.handle_error(None, ("127.0.0.1", 1))
    assert capsys.readouterr().err == ""
    try:
        raise ValueError("a real bug")
    except ValueError:
        httpd.handle_error(None, ("127.0.0.1", 1))
    assert "ValueError: a real bug" in capsys.readouterr().err


def test_protocols_from_env() -> None:
    m, c = constants.METADATA_PROTOCOL_ENV, constants.CLOUD_ENV
    assert protocols_from_env({c: "AWS"}) == ["aws"]
    assert protocols_from_env({c: "runpod"}) == []  # no notice there: signals only
    info = '{"cluster_name": "x", "cloud": "Azure", "region": "eastus", "zone": null}'
    assert protocols_from_env({constants.SKYPILOT_CLUSTER_INFO: info, c: "aws"}) == ["azure"]
    assert protocols_from_env({}) is None  # probe
    assert protocols_from_env({m: "all", c: "aws"}) == ["aws", "gcp", "azure"]
    assert protocols_from_env({m: "none"}) == []
    with pytest.raises(ValueError, match="unknown 'ibm'"):
        protocols_from_env({m: "ibm"})


# --------------------------------------------------------------------------- the manager


SCRIPT = """
import logging, sys, time, torch
from mncloud.train import CheckpointManager
logging.basicConfig(level=logging.INFO, format="%(message)s")
model = torch.nn.Linear(4, 4)
state = {"model": model, "step": 0}
ckpt = CheckpointManager(interval_steps=5, keep=2)
print("ready", flush=True)
for step in range(1, 100000):
    state["step"] = step
    time.sleep(0.01)
    ckpt.maybe_save(step, state)
"""


@pytest.mark.slow
def test_sigterm_saves_the_step_and_exits_115(tmp_path: Path) -> None:
    """A real SIGTERM: the step is saved and committed, the marker written, exit 115."""
    from mncloud.storage import CheckpointStore

    marker = tmp_path / "marker"
    env = dict(
        os.environ,
        **{
            constants.CKPT_URI_ENV: f"file://{tmp_path / 'ckpt'}",
            constants.PREEMPTION_WATCH_ENV: "1",
            constants.METADATA_PROTOCOL_ENV: "none",
            constants.PREEMPT_MARKER_ENV: str(marker),
        },
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == constants.PREEMPTED_EXIT_CODE, err
    assert marker.exists() and "preemption notice from SIGTERM" in err
    latest, _ = CheckpointStore(f"file://{tmp_path / 'ckpt'}").latest()
    assert latest is not None
    assert f"checkpoint step {latest} committed for the preemption" in err


def _manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    from mncloud.train import CheckpointManager

    monkeypatch.setenv(constants.METADATA_PROTOCOL_ENV, "none")
    monkeypatch.setenv(constants.PREEMPT_MARKER_ENV, str(tmp_path / "marker"))
    kw.setdefault("watch_preemption", True)
    return CheckpointManager(
        f"file://{tmp_path / 'ckpt'}", interval_steps=10, keep=2,
        staging_dir=tmp_path / "staging", retry_seconds=30, **kw,
    )  # fmt: skip


def _state() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    return {"model": torch.nn.Linear(64, 64), "n": 0}


def _staging_has(tmp_path: Path, step: int) -> bool:
    return (tmp_path / "staging" / "rank_0" / f"step_{step}").exists()


def test_deadline_before_upload_ends_falls_back_to_the_periodic_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mncloud.storage import set_simulated_outage
    from mncloud.train.preempt import Preempted

    uri = f"file://{tmp_path / 'ckpt'}"
    ckpt, state = _manager(tmp_path, monkeypatch, preemption_safety_s=0.2), _state()
    assert ckpt.save(10, state, wait=True)
    set_simulated_outage(uri, True)  # the bucket is unreachable: the upload cannot finish
    try:
        t0 = time.time()
        ckpt.watcher.notify(Notice("manual", t0 + 1.5, t0))
        with pytest.raises(Preempted) as exc:
            ckpt.maybe_save(13, state)
        took = time.time() - t0
    finally:
        set_simulated_outage(uri, False)
    assert exc.value.code == constants.PREEMPTED_EXIT_CODE and exc.value.step == 13
    # It waited for the upload until the notice's deadline less the safety margin, then
    # stopped on the periodic step (no upper bound on the time: a busy CI machine is slow).
    assert exc.value.committed == 10 and took >= 1.0
    assert (tmp_path / "marker").exists()
    ckpt.close()  # after a preemption: returns at once, abandons the upload
    again = _manager(tmp_path, monkeypatch, watch_preemption=False)
    assert again.load(_state()) == 10  # step 13 has no COMPLETE, whatever its upload did
    again.close()


def test_notice_during_a_periodic_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic save (step 10) is still uploading when the notice comes: step 11 is saved
    beside it and committed; nothing hangs."""
    from mncloud.storage import set_simulated_outage
    from mncloud.train.preempt import Preempted

    uri = f"file://{tmp_path / 'ckpt'}"
    ckpt, state = _manager(tmp_path, monkeypatch), _state()
    set_simulated_outage(uri, True)
    assert ckpt.maybe_save(10, state)  # starts; its upload retries while the bucket is down
    assert ckpt._pending is not None and not ckpt._pending.future.done()

    def bucket_back_once_step_11_is_staged() -> None:
        deadline = time.monotonic() + 30
        while not _staging_has(tmp_path, 11) and time.monotonic() < deadline:
            time.sleep(0.005)
        set_simulated_outage(uri, False)

    helper = threading.Thread(target=bucket_back_once_step_11_is_staged)
    helper.start()
    t0 = time.time()
    ckpt.watcher.notify(Notice("manual", t0 + 20, t0))
    state["n"] = 11
    with pytest.raises(Preempted) as exc:
        ckpt.maybe_save(11, state)
    helper.join()
    assert exc.value.committed == 11 and time.time() - t0 < 18
    again = _manager(tmp_path, monkeypatch, watch_preemption=False)
    restored = _state()
    assert again.load(restored) == 11 and restored["n"] == 11
    again.close()


def test_no_watch_installs_no_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = signal.getsignal(signal.SIGTERM)
    ckpt = _manager(tmp_path, monkeypatch, watch_preemption=False)
    assert ckpt.watcher is None and signal.getsignal(signal.SIGTERM) is before
    ckpt.close()
    watched = _manager(tmp_path, monkeypatch)
    assert signal.getsignal(signal.SIGTERM) is not before
    watched.close()
    assert signal.getsignal(signal.SIGTERM) is before


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_notice_at_a_random_step_loses_no_step(s3_env: Any) -> None:
    """2 nodes × 2 ranks: node 1 gets an AWS notice at a random step; all 4 ranks save that
    step, exit 115, and the run resumes there with the uninterrupted run's final weights."""
    import random

    from mncloud.backends.base import RunState
    from mncloud.backends.local.figures import read_final, recovery_figures
    from mncloud.layout import run_dir
    from mncloud.storage import CheckpointStore
    from tests.reference import reference_final
    from tests.test_local import (
        EXAMPLE,
        TRAIN_ARGS,
        cli,
        run_log,
        state_of,
        steps_since,
        up,
        wait_final,
        wait_until,
    )

    flags = ["--nodes", "2", "--gpus", "cpu:2", "--recovery-delay", "0s"]
    bucket = s3_env.make_bucket()
    # Steps of >= 80 ms (the reference runs without the sleep: the same weights): however late
    # a busy machine sees step `at`, >= 7 s of steps are left for the notice to stop.
    train = [*TRAIN_ARGS, "--compute-ms", "80"]
    up("notice", EXAMPLE, *flags, "--bucket", f"s3://{bucket}/exp", script_args=train)
    at = random.randrange(15, 60)
    wait_until(lambda: max(steps_since("notice", 0), default=0) >= at, 120, f"step {at}")
    cli("chaos", "preempt", "notice", "--node", "1", "--notice", "30s", "--cloud-protocol", "aws")
    events = wait_until(
        lambda: [e for e in state_of("notice").events if e.kind == "preempted"], 60, "the stop"
    )
    saved = events[0].data["latest_checkpoint"]  # read its manifest before keep-last-2 drops it
    manifest = CheckpointStore(f"s3://{bucket}/exp/notice").read_manifest(saved)
    assert manifest.extra.get("preemption") and manifest.world_size == 4
    assert {f"rank_{r}.pt" for r in range(4)} <= set(manifest.files)  # all 4 ranks saved it
    state = wait_final("notice")
    assert state.state is RunState.SUCCEEDED, run_log("notice")

    preempted = next(e for e in state.events if e.kind == "preempted")
    assert preempted.data["exit_codes"] == {"0": 115, "1": 115}  # both nodes stopped on purpose
    assert not any(e.kind == "chaos-preempt" for e in state.events)  # nobody had to be killed
    fig = recovery_figures(run_dir("notice"))
    # The step saved on the notice is the last one trained: `maybe_save` reports it (to the
    # telemetry) before it saves it and exits 115.
    assert fig.resumed_from[1] == saved == max(fig.steps_per_attempt[0]) >= at
    assert fig.lost_per_recovery == [0] and (state.restarts, state.preemptions) == (1, 1)
    # The uninterrupted run (test_local's, when it ran first in this session; else run now).
    final, reference = read_final(state.ckpt_uri), reference_final(EXAMPLE, flags[:4], train)
    assert final and reference and final["weights_sha256"] == reference["weights_sha256"]
    assert f"all 4 ranks save step {saved}" in run_log("notice")
