"""Training telemetry through the bucket (`mncloud/telemetry/series.py`): segments written by
ranks, never overwritten, compacted when read; bad input skipped and counted; and a cloud-like
run (real processes with the cloud's environment, the real S3 test server) preempted once,
whose goodput ledger has no `unknown` part."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sky.jobs import ManagedJobStatus
from typer.testing import CliRunner

from mncloud import constants, layout
from mncloud.cli import app
from mncloud.operate import run_goodput, run_series
from mncloud.records.model import RunRecord
from mncloud.records.store import create_record, load_current
from mncloud.request import build_spec
from mncloud.storage import join_key, open_bucket
from mncloud.telemetry.series import Series, SeriesWriter, finite_metrics, read_series
from tests.servers import use_s3

if TYPE_CHECKING:
    from tests.fakesky import FakeSky
    from tests.servers import S3Server


def _writer(uri: str, rank: int = 0) -> SeriesWriter:
    return SeriesWriter(uri, rank, node=0, background=False)


def test_segments_round_trip_and_are_never_overwritten(bucket_uri: str) -> None:
    uri = f"{bucket_uri}/series"
    w0, w1 = _writer(uri, 0), _writer(uri, 1)
    for step in (1, 2, 3):
        w0.add({"k": "step", "t": 100.0 + step, "step": step, "m": {"loss": 4.0 - step}})
        w1.add({"k": "step", "t": 100.2 + step, "step": step})
        if step == 2:
            assert w0.flush() and w1.flush()
    w0.add({"k": "step", "t": 103.5, "step": 3, "ckpt_s": 0.4})  # the same step again: merged
    assert w0.flush() and w1.flush()
    assert not w0.flush()  # nothing buffered: no empty segment
    bucket, prefix = open_bucket(uri)
    keys = [o.key for o in bucket.list(f"{prefix}/" if prefix else "")]
    names = sorted(k.rsplit("/", 1)[-1] for k in keys if k.endswith(".jsonl"))
    assert len(names) == len(set(names)) == 4
    assert all(n.startswith(("r00000-", "r00001-")) for n in names)
    rollups = sorted(k.rsplit("/", 2)[-2:] for k in keys if not k.endswith(".jsonl"))
    assert rollups == [["rollup", f"r0000{w.rank}-{w.launch}.json"] for w in (w0, w1)]
    series = read_series(uri)
    assert series.segments == 4 and series.skipped == 0
    assert [(r.rank, r.step) for r in series.steps] == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3),
                                                         (1, 3)]  # fmt: skip
    (three,) = [r for r in series.steps if r.rank == 0 and r.step == 3]
    assert three.t == 103.0 and three.ckpt_s == 0.4  # earliest time, the save's stall
    assert [(p.step, p.value) for p in series.metrics["loss"]] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    (launch,) = series.launches()
    assert (launch.first_step, launch.last_step) == (1, 3)


def test_a_torn_or_malformed_segment_is_skipped_and_counted(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'b'}/series"
    w = _writer(uri)
    w.add({"k": "step", "t": 1.0, "step": 1, "m": {"loss": 2.0}})
    assert w.flush()
    bucket, prefix = open_bucket(uri)
    good = json.dumps({"k": "head", "rank": 1, "launch": "x"}) + "\n"
    bucket.put_bytes(
        join_key(prefix, "r00001-x-00000.jsonl"), (good + '{"k": "step", "t"').encode()
    )
    bucket.put_bytes(join_key(prefix, "r00001-x-00001.jsonl"), b"not json\n")
    bucket.put_bytes(join_key(prefix, "r00001-x-00002.jsonl"), (good + '{"k":"step"}\n').encode())
    series = read_series(uri)
    assert (series.segments, series.skipped) == (4, 3)
    assert [(r.rank, r.step) for r in series.steps] == [(0, 1)]
    assert [p.value for p in series.metrics["loss"]] == [2.0]


def test_a_non_finite_metric_is_dropped_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mncloud.train import steptime

    assert finite_metrics({"loss": 1, "x": float("nan"), "y": "abc", "z": True}) == (
        {"loss": 1.0},
        ["x", "y", "z"],
    )
    ckpt = f"file://{tmp_path / 'b'}/exp"
    monkeypatch.setenv(constants.CKPT_URI_ENV, ckpt)
    monkeypatch.setenv(constants.RUN_ID_ENV, "exp-1")
    monkeypatch.setattr(steptime, "_series", None)
    monkeypatch.setattr(steptime, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=steptime.__name__):
        for step in (1, 2, 3):
            steptime.report(step, loss=1.0 / step, grad_norm=float("inf"))
    assert len([r for r in caplog.records if "grad_norm" in r.getMessage()]) == 1
    writer = steptime._series
    assert writer and writer.flush()
    series = read_series(layout.series_uri(ckpt, "exp-1"))
    assert set(series.metrics) == {"loss"} and len(series.metrics["loss"]) == 3


def test_a_writer_opens_its_bucket_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every segment through the one bucket (an S3 client is a boto3 session: tens of ms of
    CPU a rank each time it was made again, every 0.2 s in the tests' runs)."""
    from mncloud import storage

    opened: list[str] = []
    real = storage.open_bucket
    monkeypatch.setattr(
        storage, "open_bucket", lambda uri, **kw: opened.append(uri) or real(uri, **kw)
    )
    uri = f"file://{tmp_path / 'b'}/series"
    w = _writer(uri)
    for step in (1, 2, 3):
        w.add({"k": "step", "t": float(step), "step": step})
        assert w.flush()
    assert opened == [uri] and read_series(uri).segments == 3


def test_a_failing_bucket_never_raises_and_keeps_the_records(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the bucket's folder would be: every write fails
    w = _writer(f"file://{blocker}/series")
    w.add({"k": "step", "t": 1.0, "step": 1})
    assert not w.flush()
    assert len(w._buffer) == 1  # kept for the next try


# ---------------------------------------------------------------- a cloud run, for real

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"
STEPS, EVERY = 40, 10
UP = ["up", "train.py", "--gpus", "H100:8", "--nodes", "2", "--cloud", "aws", "--spot",
      "--recovery", "gang", "--name", "cl", "--yes", "--detach", "--no-preflight"]  # fmt: skip
FAST_TELEMETRY = {constants.TELEMETRY_INTERVAL_ENV: "0.2"}  # segments every 0.2 s, not 30
# Steps of ≥ 150 ms: the nodes are killed past step 15, ≥ 3.7 s before the run could end.
ARGS = ["--", "--steps", str(STEPS), "--ckpt-interval", str(EVERY), "--compute-ms", "150"]


def _wait_for_step(uri: str, step: int, timeout: float = 120.0) -> None:
    """Until a rank's step `step` is in the bucket; each look fetches only the segments
    written since the last (`SeriesTail`), not all of them (4 ranks write 20 a second)."""
    from mncloud.telemetry.seriestail import SeriesTail

    tail, deadline = SeriesTail(uri), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.step >= step for r in tail.read().steps):
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} never reached the bucket")


def _sky_faked(monkeypatch: pytest.MonkeyPatch, fake: FakeSky | None = None) -> FakeSky:
    """As the `fake_sky` fixture: SkyPilot's SDK faked, `down`'s notice on a test clock."""
    from mncloud.backends.skypilot import notice
    from tests import fakesky
    from tests.ticking import NoticeTime

    monkeypatch.setattr(notice, "time", NoticeTime())
    return fakesky.install(monkeypatch, fake)


@dataclass(frozen=True)
class CloudRun:
    """What the module's one cloud run left: its home, project folder and faked SkyPilot."""

    home: Path
    project: Path
    fake: FakeSky


@pytest.fixture(scope="module")
def cloud_run_once(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> CloudRun:
    """`mncloud up` of examples/train_ddp.py as a 2-node spot managed job on the faked
    SkyPilot; the task SkyPilot got runs on real local "nodes" (`tests/skynodes.py`: real
    torchrun, 2 ranks each, the cloud's environment) writing through `mncloud.train` to the
    S3 test server. Past step 15 every node is killed (a preemption; SkyPilot's queue shows
    RECOVERING), the same task starts again (the recovery: it resumes from the newest complete
    checkpoint) and finishes; `status` then sees the job SUCCEEDED. Only SkyPilot's API is
    faked: the record's events are the ones `up` and `status` wrote. Run once for the module:
    each test reads it (`cloud_run`), none changes it."""
    from tests.skynodes import start

    home = tmp_path_factory.mktemp("series-home")
    project = tmp_path_factory.mktemp("series-project")
    (project / "pyproject.toml").write_text("[project]\nname='p'\n")
    shutil.copy(EXAMPLE, project / "train.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(home))
        mp.chdir(project)
        s3_env = use_s3(s3_server, mp)
        fake_sky = _sky_faked(mp)
        bucket = f"s3://{s3_env.make_bucket()}"
        result = CliRunner().invoke(app, [*UP, "--bucket", bucket, *ARGS])
        assert result.exit_code == 0, result.output
        ((job_id, job),) = fake_sky.jobs.items()
        record = load_current("cl")
        assert record.ckpt_uri is not None
        uri = layout.series_uri(record.ckpt_uri, record.run_id)

        fake_sky.set_status(job_id, ManagedJobStatus.RUNNING)
        node = {"task_id": f"sky-managed-{job_id}", "gpus_per_node": 2, "env": FAST_TELEMETRY}
        first = start(job.yaml, **node)
        _wait_for_step(uri, 15)
        first.kill()
        fake_sky.set_status(job_id, ManagedJobStatus.RECOVERING)
        fake_sky.set_status(job_id, ManagedJobStatus.RUNNING)
        second = start(job.yaml, **node)
        assert second.wait(180) == [0, 0], second.log[-3000:]
        fake_sky.set_status(job_id, ManagedJobStatus.SUCCEEDED)
        shown = CliRunner().invoke(app, ["status", "cl", "--json"])
        assert shown.exit_code == 0, shown.output
    return CloudRun(home, project, fake_sky)


@pytest.fixture
def cloud_run(
    cloud_run_once: CloudRun, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> tuple[RunRecord, Series]:
    """The module's cloud run (`cloud_run_once`) in this test: its home, folder, S3 and faked
    SkyPilot in place; its record and telemetry."""
    monkeypatch.setenv("MNCLOUD_HOME", str(cloud_run_once.home))
    monkeypatch.chdir(cloud_run_once.project)
    use_s3(s3_server, monkeypatch)
    _sky_faked(monkeypatch, cloud_run_once.fake)
    series = run_series(load_current("cl"))
    assert series is not None
    return load_current("cl"), series


@pytest.mark.slow
@pytest.mark.catalog
def test_a_cloud_run_preempted_once_has_no_unknown_part(
    cloud_run: tuple[RunRecord, Series],
) -> None:
    """The relaunch is read off the telemetry: no part is `unknown`, the parts add up to the
    total to the cent, the steps A trained past its last checkpoint are redone; the loss
    spans both launches; `status` shows the goodput."""
    record, series = cloud_run
    assert [e.kind for e in record.events] == ["launch", "finish"]  # what `up`, `status` wrote
    launch = record.events[0]
    assert launch.spot and launch.cloud == "aws" and launch.hourly_price
    a, b = series.launches()
    kept = b.first_step - 1
    assert kept % EVERY == 0 and kept <= a.last_step and b.last_step == STEPS
    loss = series.curve("loss")
    assert {p.launch for p in loss} <= a.tags | b.tags
    assert {p.launch in b.tags for p in loss} == {False, True}  # both launches

    ledger = run_goodput(record)
    assert ledger.parts["unknown"].node_seconds == 0 and not ledger.unmeasured
    assert ledger.launches == 2
    assert sum(p.cents for p in ledger.parts.values()) == round(ledger.total_cost * 100)
    assert abs(sum(p.cost for p in ledger.parts.values()) - ledger.total_cost) < 0.005
    trained_in_a = {r.step for r in series.steps if r.t < b.t0}
    assert ledger.parts["redone"].steps == len(trained_in_a & set(range(kept + 1, STEPS + 1)))
    assert ledger.parts["checkpoint_stall"].node_seconds > 0
    assert ledger.goodput is not None and 0 < ledger.goodput < 1
    _metrics_cli_shows_both_launches(kept)
    (row,) = json.loads(CliRunner().invoke(app, ["status", "cl", "--json"]).output)
    assert row["state"] == "SUCCEEDED"
    assert row["goodput"] == pytest.approx(ledger.goodput, abs=0.02)


def _metrics_cli_shows_both_launches(kept: int) -> None:
    """`mncloud metrics` prints the same series: the loss over both launches, redone steps
    twice, each node's step time."""
    result = CliRunner().invoke(app, ["metrics", "cl", "--json"])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    by_launch = {
        k: [p["step"] for p in view["metrics"]["loss"] if p["launch"] == k] for k in (1, 2)
    }
    assert by_launch[1][0] == 1 and by_launch[2] == list(range(kept + 1, STEPS + 1))
    assert set(by_launch[1]) & set(by_launch[2])  # redone steps show in both launches
    assert set(view["step_time"]) == {"node 0", "node 1"}
    assert all(0.09 < p["value"] < 5 for p in view["step_time"]["node 0"])  # 150 ms compute
    assert [m["launch"] for m in view["launches"]] == [1, 2]
    lines = CliRunner().invoke(app, ["metrics", "cl"]).output.splitlines()
    assert lines[0].startswith("launch 1  step       1  loss ")


@pytest.mark.slow
@pytest.mark.catalog
def test_the_run_page_draws_the_loss_across_both_launches_in_a_browser(
    cloud_run: tuple[RunRecord, Series],
) -> None:
    """The web view (real uvicorn, real chromium): the loss curve, a line per launch, the
    relaunch marked, step time per node; offline (nothing fetched)."""
    import uvicorn

    from mncloud.ui import serve as ui_serve
    from mncloud.ui.app import create_app
    from tests.test_local import wait_until
    from tests.test_ui import _browser

    sync_api, chromium = _browser()
    port = ui_serve.free_port()
    bound = ui_serve.Binding("127.0.0.1", port, None)
    config = uvicorn.Config(
        create_app(allowed_hosts=ui_serve.allowed_hosts(bound)),
        host="127.0.0.1", port=port, log_level="warning", ws="none",
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "uvicorn to start")
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium)
            page = browser.new_page(viewport={"width": 1000, "height": 1400})
            outside: list[str] = []
            page.on("request", lambda r: None if "127.0.0.1" in r.url else outside.append(r.url))
            page.goto(f"http://127.0.0.1:{port}/runs/cl")
            loss = page.locator('#curves svg[data-kind="metric-loss"]')
            sync_api.expect(loss.locator("polyline.launch")).to_have_count(2)
            sync_api.expect(loss.locator("g.relaunch")).to_have_count(1)
            resumed = f"from step {cloud_run[1].launches()[1].first_step}"
            sync_api.expect(loss.locator("g.relaunch")).to_contain_text(resumed)
            steps = page.locator('#curves svg[data-kind="step-time"] polyline.node')
            sync_api.expect(steps).to_have_count(2)
            sync_api.expect(page.locator("#goodput")).to_contain_text("over 2 launch(es)")
            assert not outside
            browser.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_metrics_of_an_unknown_run_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(app, ["metrics", "nope"])
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line.startswith("error: ") and "nope" in line


def test_stragglers_read_through_the_segments(tmp_path: Path) -> None:
    """`status` reads each rank's step-time windows off the segments: rank 1, 1.8× slower
    over its newest launch's last windows, is a straggler."""
    from mncloud.telemetry import steps as telemetry

    ckpt = f"file://{tmp_path / 'b'}/exp"
    for rank, seconds in ((0, 0.1), (1, 0.18), (2, 0.1)):
        w = _writer(layout.series_uri(ckpt, "exp-1"), rank)
        for step in range(1, 200):
            w.add({"k": "step", "t": 1000.0 + step * seconds, "step": step})
        assert w.flush()
    ranks = telemetry.read_steps(layout.series_uri(ckpt, "exp-1"))
    assert {r: round(s.seconds_per_step, 3) for r, s in ranks.items()} == {0: 0.1, 1: 0.18, 2: 0.1}
    times = {r: s.sustained() for r, s in ranks.items()}
    assert telemetry.straggler_ranks({r: t for r, t in times.items() if t}) == [1]


def test_two_runs_of_a_lineage_share_the_loss_chart(tmp_path: Path) -> None:
    """A rerun (the same name, a newer record) draws its loss over the previous run's."""
    pytest.importorskip("fastapi.testclient", reason="needs the [ui] extra")
    from fastapi.testclient import TestClient

    from mncloud.ui.app import create_app

    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    spec = build_spec(
        tmp_path / "train.py", gpus="cpu:1", name="lin", bucket=f"file://{tmp_path}/b"
    )
    runs = [create_record(spec, "a: 1\n", backend="skypilot", now=t) for t in (100.0, 200.0)]
    for k, run in enumerate(runs):
        assert run.ckpt_uri is not None
        w = _writer(layout.series_uri(run.ckpt_uri, run.run_id))
        for step in range(1, 30):
            w.add(
                {
                    "k": "step",
                    "t": 100.0 * (k + 1) + step,
                    "step": step,
                    "m": {"loss": k + 1 / step},
                }
            )
        assert w.flush()
    page = TestClient(create_app(), raise_server_exceptions=False).get("/runs/lin")
    assert page.status_code == 200, page.text
    loss = page.text.split('data-kind="metric-loss"')[1].split("</svg>")[0]
    assert loss.count('<polyline class="previous"') == 1
    assert loss.count('<polyline class="launch launch-1"') == 1


def test_a_read_compacts_many_segments_into_one(tmp_path: Path) -> None:
    """Reads merge many small segments (of a series written before rollups) into one object;
    what they say is unchanged, a torn one stays and is still counted, and a second
    compaction merges the first's output."""
    from mncloud.telemetry import series as series_mod

    uri = f"file://{tmp_path / 'b'}/series"
    writers = [SeriesWriter(uri, rank, node=0, background=False, rollup=False) for rank in (0, 1)]
    for step in range(1, series_mod.COMPACT_AT + 1):
        for w in writers:
            w.add({"k": "step", "t": step + w.rank / 10, "step": step, "m": {"loss": 1 / step}})
            assert w.flush()
    bucket, prefix = open_bucket(uri)
    bucket.put_bytes(join_key(prefix, "r00009-x-00000.jsonl"), b'{"k": "head"')
    before = read_series(uri)
    assert (before.segments, before.skipped) == (2 * series_mod.COMPACT_AT + 1, 1)
    assert read_series(uri, compact=True).steps == before.steps
    names = sorted(o.key.rsplit("/", 1)[-1] for o in bucket.list(f"{prefix}/" if prefix else ""))
    assert len(names) == 2 and names[0].startswith("c-") and names[1].startswith("r00009")
    after = read_series(uri)
    assert after.steps == before.steps and after.curve("loss") == before.curve("loss")
    assert (after.segments, after.skipped) == (2, 1)
    assert after.launches() == before.launches()
