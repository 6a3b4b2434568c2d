"""Run records: lineage from real git repos, the cost ledger, redaction, stragglers, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud import constants, layout
from mncloud.errors import RunNotFoundError
from mncloud.export import ExportFormat
from mncloud.records import store
from mncloud.records.ledger import cost_summary, observed_spot_hazard
from mncloud.records.model import Event, RecordError, RunRecord
from mncloud.records.rerun import prepare_rerun
from mncloud.records.store import (
    append_event,
    create_record,
    find_record,
    list_bucket_records,
    list_records,
    load_current,
    load_diff,
)
from mncloud.redact import Redactor
from mncloud.request import build_spec
from mncloud.spec import Accelerator, JobSpec, Parallel, Recovery
from mncloud.spec.launch import LaunchOptions
from mncloud.storage import open_bucket
from mncloud.telemetry import steps as telemetry
from mncloud.telemetry.series import SeriesWriter
from mncloud.telemetry.steps import step_times, straggler_note, straggler_ranks

# Planted secrets: each must appear in no file written under MNCLOUD_HOME or the bucket.
SECRET_VALUE = "s3cr3t-planted-value-91c7"
TOKEN_VALUE = "tok-planted-27b1e4f0aa"
# Built at run time so no credential-shaped literal sits in the repository.
AWS_KEY_ID = "AKIA" + "PLANTED000000001"
HF_TOKEN = "hf_PlantedHuggingFaceTokenValue1234"
PLANTED = (SECRET_VALUE, TOKEN_VALUE, AWS_KEY_ID, HF_TOKEN, "pl4nted-password")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return proc.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with a committed training script, then edits and an untracked file."""
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "pyproject.toml").write_text("[project]\nname='proj'\n")
    (root / "train.py").write_text("print('v1')\n")
    (root / ".gitignore").write_text("ignored/\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "v1")
    (root / "train.py").write_text("print('v2')\n")  # uncommitted change
    (root / "notes.txt").write_text("untracked\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "big.bin").write_bytes(b"x" * 10)
    return root


def make_spec(repo: Path, bucket: str | None = None, **kw: object) -> JobSpec:
    return build_spec(
        repo / "train.py",
        ["--lr", "0.1"],
        gpus="cpu:2",
        nodes=2,
        cloud=["local"],
        bucket=bucket,
        name=kw.pop("name", "exp"),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def all_files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def assert_no_planted(*roots: Path) -> None:
    files = all_files(*roots)
    assert files
    for path in files:
        data = path.read_bytes()
        for value in PLANTED:
            assert value.encode() not in data, f"{value} leaked into {path}"


# --------------------------------------------------------------------------- the record


def test_record_has_every_field(repo: Path, mncloud_home: Path) -> None:
    spec = make_spec(repo, label=["team=nlp"], image="docker:pytorch/pytorch:latest")
    record = create_record(spec, "name: exp\n", None, "local", now=1_700_000_000)
    assert record.run_id.startswith("exp-20231114T221320-")
    path = mncloud_home / "records" / record.run_id / "run.json"
    data = json.loads(path.read_text())
    for key in ("run_id", "name", "user", "host", "created_at", "git", "spec", "task_yaml"):
        assert data[key], key
    assert data["image"] == "docker:pytorch/pytorch:latest"
    assert data["labels"] == {"team": "nlp"}
    assert data["nodes"] == 2
    assert "pydantic" in {k.lower() for k in data["packages"]}
    g = data["git"]
    assert g["commit"] == git(repo, "rev-parse", "HEAD")
    assert g["branch"] == "main"
    assert [u["path"] for u in g["untracked"]] == ["notes.txt"]  # ignored/ is not listed
    diff = (path.parent / "diff.patch").read_bytes()
    assert b"+print('v2')" in diff
    import hashlib

    assert g["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    assert g["diff_redacted"] is False
    assert find_record(record.run_id).run_id == record.run_id
    assert find_record("exp").run_id == record.run_id
    assert find_record(record.run_id[:-2]).run_id == record.run_id


def test_record_outside_git_and_clean_tree(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("pass\n")
    spec = build_spec(plain / "train.py", gpus="cpu:1", cloud=["local"], name="plain")
    assert create_record(spec, "x: 1\n").git is None


def test_records_of_one_name_accumulate(repo: Path) -> None:
    spec = make_spec(repo)
    first = create_record(spec, "a: 1\n", now=1_700_000_000)
    git(repo, "commit", "-qam", "v2")
    second = create_record(spec, "a: 2\n", now=1_700_000_100)
    ids = [r.run_id for r in list_records()]
    assert ids == [first.run_id, second.run_id]
    assert load_diff(first).startswith(b"diff --git")
    assert load_diff(second) == b""  # clean tracked tree now
    with pytest.raises(RunNotFoundError, match="no run record"):
        find_record("nope")


@pytest.mark.slow
def test_record_in_bucket_and_bucket_failure_never_breaks(
    repo: Path, bucket_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    spec = make_spec(repo, bucket=bucket_uri)
    record = create_record(spec, "a: 1\n")
    assert record.bucket_uri == f"{bucket_uri}/exp/runs/{record.run_id}"
    bucket, prefix = open_bucket(record.bucket_uri)
    stored = RunRecord.model_validate_json(bucket.get_bytes(f"{prefix}/run.json"))
    assert stored.run_id == record.run_id
    assert b"+print('v2')" in bucket.get_bytes(f"{prefix}/diff.patch")
    append_event("exp", "launch", hourly_price=1.0, spot=True, cloud="local")
    stored = RunRecord.model_validate_json(bucket.get_bytes(f"{prefix}/run.json"))
    assert [e.kind for e in stored.events] == ["launch"]
    found = list_bucket_records(bucket_uri)
    assert [r.run_id for r in found] == [record.run_id]


def test_broken_bucket_only_warns(
    repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "down").write_text("a file where the bucket's folder should be")
    spec = make_spec(repo, bucket=f"file://{tmp_path / 'down'}")
    monkeypatch.setattr(store, "BUCKET_RETRY_SECONDS", 0.2)
    record = create_record(spec, "a: 1\n")
    assert load_current("exp").run_id == record.run_id
    assert "run record not written" in caplog.text


# --------------------------------------------------------------------------- redaction


def test_planted_secrets_absent_from_every_file(
    repo: Path, tmp_path: Path, mncloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SECRET", SECRET_VALUE)
    monkeypatch.setenv("WANDB_API_KEY", "pl4nted-password")
    # A secret committed by mistake into the working tree's diff, and an AWS key id in an arg.
    (repo / "train.py").write_text(f"print('v2')\nTOKEN = '{HF_TOKEN}'\n")
    bucket = tmp_path / "bucket"
    spec = build_spec(
        repo / "train.py",
        ["--key", AWS_KEY_ID],
        gpus="cpu:2",
        cloud=["local"],
        bucket=f"file://{bucket}",
        name="leaky",
        env=[f"SERVICE_TOKEN={TOKEN_VALUE}", "PLAIN=visible-value"],
        allow_secret_env=True,  # the user insists: the record must still scrub it
        secret=["MY_SECRET"],
        label=["note=pl4nted-password"],
    )
    from mncloud.render import render

    task = render(spec)
    assert TOKEN_VALUE in task.yaml_text  # --env is rendered by design; the record is not
    record = create_record(spec, task)
    append_event("leaky", "failure", detail=f"crashed with MY_SECRET={SECRET_VALUE}")
    assert record.git is not None
    assert load_current("leaky").git.diff_redacted  # type: ignore[union-attr]
    assert_no_planted(mncloud_home, bucket)
    data = (mncloud_home / "records" / record.run_id / "run.json").read_text()
    assert "visible-value" in data and "<redacted>" in data


@pytest.mark.parametrize(
    "text",
    [
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        '"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEv\\n-----END PRIVATE KEY-----\\n"',
        "https://user:ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/x/y.git",
        "Authorization: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
        "export SLACK=xoxb-1234567890-abcdefghij",
    ],
)
def test_redactor_patterns(text: str) -> None:
    scrubbed = Redactor().scrub(text)
    assert "<redacted>" in scrubbed
    for word in ("wJalrX", "MIIEv", "ghp_abc", "dozjgN", "xoxb-1234"):
        assert word not in scrubbed


def test_redactor_leaves_ordinary_text() -> None:
    text = "torchrun --nnodes 2 train.py --lr 0.1 # key step: 3000, cache_key=abc"
    assert Redactor().scrub(text) == text


# --------------------------------------------------------------------------- cost ledger


def ledger(*events: Event, plan: dict | None = None, nodes: int = 2) -> RunRecord:
    return RunRecord(
        run_id="r-1",
        name="r",
        user="u",
        host="h",
        created_at=0,
        backend="local",
        nodes=nodes,
        spec={},
        task_yaml="",
        plan=plan,
        events=list(events),
    )


H = 3600.0


def test_cost_segments_split_by_preemption_and_market() -> None:
    record = ledger(
        Event(kind="launch", time=0, cloud="aws", spot=True, hourly_price=40.0),
        Event(kind="checkpoint", time=1.5 * H, step=3000),
        Event(kind="preemption", time=2 * H, node=1),
        Event(kind="recovery", time=2.2 * H, cloud="gcp", spot=True, hourly_price=45.0),
        Event(kind="failure", time=3.2 * H),
        Event(kind="restart", time=3.3 * H, cloud="aws", spot=False, hourly_price=100.0),
        plan={"choice": {"expected_cost": 500.0, "hourly_total": 40.0}},
    )
    summary = cost_summary(record, now=4.3 * H)
    segs = summary.segments
    assert [(s.opened_by, s.ended_by, s.open) for s in segs] == [
        ("launch", "preemption", False),
        ("recovery", "failure", False),
        ("restart", None, True),
    ]
    assert [round(s.cost or 0, 6) for s in segs] == [80.0, 45.0, 100.0]
    assert summary.spot == pytest.approx(125.0)
    assert summary.on_demand == pytest.approx(100.0)
    assert summary.total == pytest.approx(225.0)
    assert summary.estimate == 500.0 and summary.estimate_hourly == 40.0
    assert (summary.preemptions, summary.restarts) == (1, 2)


def test_unpriced_segment_and_finish() -> None:
    record = ledger(Event(kind="launch", time=0), Event(kind="finish", time=H))
    summary = cost_summary(record, now=10 * H)
    assert summary.total == 0 and summary.unpriced_hours == pytest.approx(1.0)
    assert record.finished


def test_append_event_inherits_placement(repo: Path) -> None:
    create_record(make_spec(repo), "a: 1\n")
    append_event("exp", "launch", cloud="aws", region="us-east-1", spot=True, hourly_price=8)
    append_event("exp", "preemption", node=1)
    rec = append_event("exp", "recovery")
    assert rec is not None
    assert rec.events[-1].cloud == "aws" and rec.events[-1].hourly_price == 8
    assert append_event("never-launched", "launch") is None


def test_observed_spot_hazard() -> None:
    record = ledger(
        Event(kind="launch", time=0, cloud="aws", spot=True, hourly_price=1),
        Event(kind="preemption", time=2 * H, node=0),
        Event(kind="recovery", time=2 * H, cloud="aws", spot=True, hourly_price=1),
        Event(kind="finish", time=5 * H),
        Event(kind="launch", time=6 * H, cloud="gcp", spot=False, hourly_price=1),
        Event(kind="finish", time=7 * H),
        nodes=2,
    )
    hazard = observed_spot_hazard([record])
    assert hazard == {"aws": (pytest.approx(1 / 10), 1, pytest.approx(10.0))}


# --------------------------------------------------------------------------- stragglers


def test_straggler_ranks() -> None:
    assert straggler_ranks({0: 1.0, 1: 1.1, 2: 1.0, 3: 1.6}) == [3]
    assert straggler_ranks({0: 1.0, 1: 1.49}) == []  # median 1.245: 1.49 < 1.87
    assert straggler_ranks({0: 1.0}) == []
    assert straggler_ranks({0: 1.0, 1: 1.0, 2: 3.0}) == [2]


#: A window that counts: it timed enough steps (the first windows include warm-up).
FULL = telemetry.MIN_SAMPLES


#: Steps a window of `telemetry.from_series` spans (what `status` reads).
WINDOW = 50
_written: dict[tuple[str, int, str], tuple[int, float, SeriesWriter]] = {}


def publish_windows(
    env: dict[str, str], by_rank: dict[int, list[float | tuple[float, int]]], launch: str = "a"
) -> None:
    """Each rank's steps in its telemetry segments, as `mncloud.train.report` writes them: a
    bare number is a full window (`WINDOW` steps that many seconds apart); (seconds, steps) a
    window that timed that many steps. A rank's windows go on in its `launch`; a new launch
    starts afresh (`status` reads each rank's newest launch)."""
    uri = layout.series_uri(env[constants.CKPT_URI_ENV], env[constants.RUN_ID_ENV])
    for rank, windows in by_rank.items():
        step, t, writer = _written.get((uri, rank, launch), (0, 1000.0, None))
        writer = writer or SeriesWriter(uri, rank, background=False, launch=launch)
        if step == 0:
            writer.add({"k": "step", "t": t, "step": 0})
        for window in windows:
            secs, samples = window if isinstance(window, tuple) else (window, WINDOW)
            for _ in range(samples):
                step, t = step + 1, t + secs
                writer.add({"k": "step", "t": t, "step": step})
        assert writer.flush()
        _written[(uri, rank, launch)] = (step, t, writer)


def run_env(record: RunRecord, ckpt_uri: str | None = None) -> dict[str, str]:
    """The variables render sets on every node: where to publish, which run."""
    uri = ckpt_uri or record.ckpt_uri
    assert uri is not None
    return {constants.CKPT_URI_ENV: uri, constants.RUN_ID_ENV: record.run_id}


def test_published_step_times(repo: Path, tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'b'}"
    record = create_record(make_spec(repo, bucket=uri), "a: 1\n")
    env = run_env(record)
    assert env[constants.CKPT_URI_ENV] == f"{uri}/exp"
    publish_windows(env, {0: [1.0]})
    assert step_times(record) == {}  # one window is not sustained yet
    publish_windows(env, {0: [1.0, 1.0], 1: [1.0, 1.0, 1.0], 2: [2.0, 2.0, 2.0]})
    times = step_times(record)
    assert times == {0: 1.0, 1: 1.0, 2: 2.0}
    assert straggler_ranks(times) == [2]


@pytest.mark.slow
def test_stragglers_need_a_sustained_slowdown(repo: Path, bucket_uri: str) -> None:
    """Issue #17 item 14: a healthy 2×2 demo was flagged `straggler rank 3 (2.6× median)`
    off one warm-up window. Only a slowdown over enough well-sampled windows is flagged."""
    record = create_record(make_spec(repo, bucket=bucket_uri), "a: 1\n")
    env = run_env(record)
    assert env[constants.CKPT_URI_ENV] == f"{bucket_uri}/exp"
    series_uri = layout.series_uri(env[constants.CKPT_URI_ENV], record.run_id)

    # First steps: rank 3's 3 steps include its warm-up, 2.6× the median.
    publish_windows(env, {0: [(0.2, 3)], 1: [(0.2, 3)], 2: [(0.2, 3)], 3: [(0.52, 3)]})
    newest = {r: s.seconds_per_step for r, s in telemetry.read_steps(series_uri).items()}
    assert straggler_ranks(newest) == [3]  # what the old rule flagged
    assert step_times(record) == {}
    # Full windows; rank 3 slow once more, then calm: never slow throughout.
    full = {r: [0.2, 0.2, 0.2] for r in range(3)}
    publish_windows(env, full | {3: [0.52, 0.2, 0.21]}, launch="b")
    times = step_times(record)
    assert times == pytest.approx({0: 0.2, 1: 0.2, 2: 0.2, 3: 0.2})
    assert straggler_ranks(times) == []
    # A real straggler: 1.8× or more over the last windows, each well sampled.
    publish_windows(env, full | {3: [0.36, 0.4, 0.37]}, launch="c")
    times = step_times(record)
    assert straggler_ranks(times) == [3]
    assert straggler_note(times, [3]) == "straggler rank 3 (1.8× median)"
    # The same slowdown timed over too few steps in its newest window: not (yet) flagged.
    publish_windows(env, {3: [(0.5, FULL - 1)]}, launch="c")
    assert 3 not in step_times(record)
    assert straggler_ranks(step_times(record)) == []


def _local_run(name: str, ckpt_uri: str) -> None:
    """A running local run as its backend sees it (no processes: status only reads state)."""
    from mncloud.backends.local.state import LocalState, save_state
    from mncloud.backends.registry import record_backend

    folder = record_backend(name, "local")
    state = LocalState(
        name=name, token="t", state="RUNNING", num_nodes=2, procs_per_node=2, master_port=29500,
        ckpt_uri=ckpt_uri, task_id="x", started_at=1000.0,
    )  # fmt: skip
    save_state(folder, state)


def test_status_flags_the_straggling_rank(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from mncloud.cli import ops
    from mncloud.operate import run_status

    monkeypatch.setattr(ops, "console", Console(width=250))
    uri = f"file://{tmp_path / 'b'}"
    record = create_record(make_spec(repo, bucket=uri), "a: 1\n")
    _local_run("exp", f"{uri}/exp")
    env = run_env(record)  # as render sets them on every node
    times = [1.0, 1.05, 0.95, 1.8]  # median 1.025: rank 3 is 1.76×
    publish_windows(env, {r: [s] * telemetry.SUSTAINED_WINDOWS for r, s in enumerate(times)})
    assert any((tmp_path / "b" / "exp" / "runs" / record.run_id / "series").glob("r00003-*"))

    status = run_status("exp")
    assert status.stragglers == [3]
    assert status.step_times == pytest.approx({0: 1.0, 1: 1.05, 2: 0.95, 3: 1.8})
    assert status.detail.startswith("straggler rank 3 (1.8× median)")
    code, out, _ = cli("status", "exp", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["stragglers"] == [3] and row["step_times"]["3"] == pytest.approx(1.8)
    assert "straggler rank 3 (1.8× median)" in row["detail"]
    code, out, _ = cli("status")
    assert code == 0 and "straggler rank 3 (1.8× median)" in out

    # A run without a record, and one whose ranks are even again: nothing flagged.
    _local_run("norec", f"file://{tmp_path / 'c'}")
    assert run_status("norec").stragglers == []
    publish_windows(env, {3: [1.1]})
    calm = run_status("exp")
    assert (calm.stragglers, calm.detail) == ([], "")


@pytest.mark.slow
def test_status_reads_step_times_of_a_run_without_bucket(repo: Path) -> None:
    """A local run without --bucket publishes under its checkpoint folder, not a bucket."""
    from mncloud.operate import run_status

    record = create_record(make_spec(repo), "a: 1\n")
    assert record.bucket_uri is None and record.ckpt_uri is None
    ckpt_uri = f"file://{layout.local_ckpt_dir('exp')}"
    _local_run("exp", ckpt_uri)
    publish_windows(run_env(record, ckpt_uri), {0: [2.0] * 3, 1: [2.0] * 3, 2: [7.0] * 3})
    status = run_status("exp")
    assert status.stragglers == [2]
    assert "straggler rank 2 (3.5× median)" in status.detail


def test_straggler_note() -> None:
    times = {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0, 4: 1.6}
    assert straggler_note(times, straggler_ranks(times)) == (
        "stragglers rank 3 (2.0× median), rank 4 (1.6× median)"
    )
    assert straggler_note({0: 1.0}, []) == ""


# --------------------------------------------------------------------------- CLI


def cli(*args: str) -> tuple[int, str, str]:
    from mncloud.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cli_ls_show_cost(repo: Path) -> None:
    record = create_record(make_spec(repo), "a: 1\n")
    append_event("exp", "launch", cloud="aws", spot=True, hourly_price=3.6, at=1000.0)
    append_event("exp", "preemption", node=1, at=1000.0 + H)
    append_event("exp", "recovery", at=1000.0 + 2 * H)
    append_event("exp", "checkpoint", step=300, at=1000.0 + 2.5 * H)
    append_event("exp", "finish", at=1000.0 + 3 * H)
    code, out, _ = cli("runs", "ls", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["run_id"] == record.run_id and row["dirty"] is True
    assert row["cost"] == pytest.approx(7.2)
    code, out, _ = cli("runs", "ls")
    assert code == 0 and record.run_id in out
    from mncloud.cli import _common

    wide = _common.console.width
    _common.console.width = 80  # a default terminal, or a pipe
    try:
        code, out, _ = cli("runs", "ls")
    finally:
        _common.console.width = wide
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80
    assert record.run_id in out and "$7.20" in out and "…" not in out
    code, out, _ = cli("runs", "show", record.run_id, "--json")
    assert code == 0
    shown = json.loads(out)
    assert [e["kind"] for e in shown["events"]] == [
        "launch", "preemption", "recovery", "checkpoint", "finish"
    ]  # fmt: skip
    code, out, _ = cli("runs", "show", "exp")
    assert code == 0 and "preemption" in out and "step 300" in out
    code, out, _ = cli("runs", "cost", "exp", "--json")
    summary = json.loads(out)
    assert code == 0 and len(summary["segments"]) == 2
    assert summary["spot"] == pytest.approx(7.2) and summary["on_demand"] == 0
    code, out, _ = cli("runs", "cost", "exp")
    assert code == 0 and "preemption" in out and "$7.20" in out
    code, _, err = cli("runs", "show", "missing")
    assert code == 2 and "no run record 'missing'" in err


@pytest.mark.slow
def test_cli_cost_report_across_runs(repo: Path) -> None:
    """`runs cost` without a run: a row per run (where, state, hours, cost) and the total."""
    code, out, _ = cli("runs", "cost", "--json")
    assert code == 0 and json.loads(out) == {"runs": [], "total": 0, "hours": 0}
    first = create_record(make_spec(repo), "a: 1\n", now=500.0)
    append_event("exp", "launch", cloud="aws", spot=True, hourly_price=3.6, at=1000.0)
    append_event("exp", "preemption", node=1, at=1000.0 + H)
    append_event("exp", "recovery", at=1000.0 + 2 * H)
    append_event("exp", "finish", at=1000.0 + 3 * H)
    second = create_record(make_spec(repo, name="other"), "a: 1\n", now=600.0)
    append_event("other", "launch", cloud="gcp", spot=False, hourly_price=10.0, at=1000.0)
    append_event("other", "failure", at=1000.0 + 0.5 * H)
    code, out, _ = cli("runs", "cost", "--json")
    report = json.loads(out)
    assert code == 0
    rows = {r["run_id"]: r for r in report["runs"]}
    assert list(rows) == [first.run_id, second.run_id]
    assert rows[first.run_id]["cost"] == pytest.approx(7.2) and rows[first.run_id]["hours"] == 2
    assert rows[first.run_id]["state"] == "finished" and rows[first.run_id]["cloud"] == "aws"
    assert rows[second.run_id]["cost"] == pytest.approx(5.0)
    assert rows[second.run_id]["state"] == "failed" and rows[second.run_id]["on_demand"] == 5.0
    assert report["total"] == pytest.approx(12.2) and report["hours"] == pytest.approx(2.5)
    # The same figures as `runs cost ID` gives for each run.
    for run_id, row in rows.items():
        summary = json.loads(cli("runs", "cost", run_id, "--json")[1])
        assert summary["total"] == pytest.approx(row["cost"])
    code, out, _ = cli("runs", "cost")
    assert code == 0 and first.run_id in out and second.run_id in out
    assert "aws/local" in out and "gcp/local" in out and "failed" in out
    assert "total (2 runs)" in out and "$12.20" in out
    # A run still going is priced until now, and says so.
    create_record(make_spec(repo, name="live"), "a: 1\n")
    append_event("live", "launch", cloud="local", hourly_price=0.0)
    code, out, _ = cli("runs", "cost", "--json")
    live = [r for r in json.loads(out)["runs"] if r["name"] == "live"]
    assert code == 0 and live[0]["state"] == "running" and live[0]["cost"] == 0.0


# --------------------------------------------------------------------------- rerun


def test_rerun_rebuilds_commit_diff_and_untracked(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)
    spec = make_spec(repo, env=["MODE=fast"], label=["team=nlp"])
    record = create_record(spec, "a: 1\n")
    # The checkout moves on: new commit, the diff committed, more edits.
    git(repo, "commit", "-qam", "v2")
    (repo / "train.py").write_text("print('v3')\n")
    setup = prepare_rerun(record, tmp_path / "wt")
    assert (setup.worktree / "train.py").read_text() == "print('v2')\n"
    assert (setup.worktree / "notes.txt").read_text() == "untracked\n"
    assert not (setup.worktree / "ignored").exists()
    assert git(setup.worktree, "rev-parse", "HEAD") == record.git.commit  # type: ignore[union-attr]
    assert (repo / "train.py").read_text() == "print('v3')\n"  # the checkout is untouched
    assert setup.workdir == setup.worktree  # the recorded workdir is the repository root
    assert setup.spec.workdir == setup.workdir
    assert setup.spec.script == setup.workdir / "train.py"
    original = spec.model_dump(exclude={"script", "workdir"})
    assert setup.spec.model_dump(exclude={"script", "workdir"}) == original
    assert setup.launch_options == LaunchOptions()  # recorded without options: the defaults


@pytest.mark.slow
def test_rerun_refusals(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    record = create_record(make_spec(repo), "a: 1\n")
    (repo / "notes.txt").write_text("changed\n")
    with pytest.raises(RecordError, match=r"untracked file notes\.txt is changed"):
        prepare_rerun(record, tmp_path / "wt1")
    setup = prepare_rerun(record, tmp_path / "wt1", skip_untracked=True)
    assert setup.skipped_untracked == ["notes.txt"]
    with pytest.raises(RecordError, match="already exists"):
        prepare_rerun(record, tmp_path / "wt1", skip_untracked=True)
    # A commit the repository does not have (another clone).
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    (other / "x").write_text("x")
    git(other, "add", ".")
    git(other, "commit", "-qm", "x")
    with pytest.raises(RecordError, match=r"is not in .*git fetch origin"):
        prepare_rerun(record, tmp_path / "wt2", repo=other)
    # A redacted diff and redacted --env values.
    bad = record.model_copy(deep=True)
    bad.git.diff_redacted = True  # type: ignore[union-attr]
    with pytest.raises(RecordError, match="cannot be re-applied exactly"):
        prepare_rerun(bad, tmp_path / "wt3")
    bad = record.model_copy(deep=True)
    bad.spec["envs"] = {"HF_TOKEN": "<redacted>"}
    with pytest.raises(RecordError, match="pass it again: --env HF_TOKEN=VALUE"):
        prepare_rerun(bad, tmp_path / "wt4", skip_untracked=True)
    ok = prepare_rerun(bad, tmp_path / "wt4", skip_untracked=True, env_overrides={"HF_TOKEN": "x"})
    assert ok.spec.envs["HF_TOKEN"] == "x"
    # Outside git: nothing to rebuild from.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("pass\n")
    rec = create_record(
        build_spec(plain / "train.py", gpus="cpu:1", cloud=["local"], name="plain"), "x: 1\n"
    )
    code, _, err = cli("rerun", rec.run_id)
    assert code == 2 and "not launched from a git repository" in err


def test_rerun_cli_launches_the_recorded_spec_and_options(
    repo: Path, monkeypatch: pytest.MonkeyPatch, mncloud_home: Path
) -> None:
    """A record written before the options were split by concern (its flat shape, with the
    retired `retry_on_error`) still reruns, with the same options."""
    monkeypatch.chdir(repo)
    options = LaunchOptions(hours=3, recovery_delay=0.5, minimize="time")
    old_shape = {**options.model_dump(mode="json"), "retry_on_error": 0, "minimize": "time"}
    record = create_record(make_spec(repo), "a: 1\n", launch_options=old_shape)
    assert "retry_on_error" in find_record(record.run_id).launch_options
    seen: dict[str, object] = {}
    import mncloud.cli.up as up_mod

    def fake_launch(spec: JobSpec, launch_options: LaunchOptions, **kw: object) -> None:
        seen.update(kw, spec=spec, options=launch_options)

    monkeypatch.setattr(up_mod, "launch_and_follow", fake_launch)
    code, out, err = cli("rerun", record.run_id, "--name", "exp-again", "--yes", "--detach")
    assert code == 0, err
    assert "rebuilt " + record.run_id in out
    assert seen["yes"] and seen["detach"] and not seen["dryrun"]
    spec = seen["spec"]
    assert isinstance(spec, JobSpec) and spec.name == "exp-again"
    assert spec.script == mncloud_home / "reruns" / "exp-again" / "train.py"
    assert (str(spec.accelerator), spec.nodes, spec.clouds) == ("cpu:2", 2, ["local"])
    assert seen["options"] == options


@pytest.mark.slow
def test_rerun_keeps_every_option(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_env: object
) -> None:
    """Issue #12: a run launched with every `up` option set reruns with the same JobSpec and
    LaunchOptions, field by field (paths moved into the rebuilt tree)."""
    monkeypatch.chdir(repo)
    monkeypatch.setenv("MY_SECRET", SECRET_VALUE)
    (repo / "requirements.txt").write_text("numpy\n")
    (repo / "task.yaml.j2").write_text("name: {{ name }}\n")
    git(repo, "add", "requirements.txt", "task.yaml.j2")
    git(repo, "commit", "-qm", "requirements and template")
    bucket = f"s3://{s3_env.make_bucket()}/team"  # type: ignore[attr-defined]
    spec = build_spec(
        repo / "train.py",
        ["--lr", "0.1", "--log", "x"],
        gpus="cpu:4",
        nodes=3,
        min_nodes=2,
        spot=True,
        cloud=["aws", "gcp"],
        region=["us-east-1", "us-central1"],
        bucket=bucket,
        mount_bucket=True,
        env=["MODE=fast", "SEED=7"],
        secret=["MY_SECRET"],
        setup="echo setup",
        requirements="requirements.txt",
        disk_size=123,
        image="docker:pytorch/pytorch:latest",
        label=["team=nlp"],
        max_hourly=42.5,
        max_restarts=9,
        master_port=31234,
        nccl_debug="INFO",
        nccl_socket_ifname="eth1",
        network="standard",
        min_bandwidth=3.5,
        require_path=["/data/shard-0", f"{bucket}/data"],
        preflight=False,
        launcher="accelerate",
        ckpt_dir="/ckpt",
        resume_args="--resume_from_checkpoint {ckpt}",
        tracker="none",
        name="every",
    )
    # Node recovery needs torchrun, which this spec's launcher is not: set the field directly,
    # for the round trip through the record only.
    spec = spec.model_copy(
        update={
            "recovery": Recovery.NODE,
            "export_on_finish": ExportFormat.TORCH,
            "gpu_alternatives": [Accelerator(name="A100-80GB", count=8)],
            "parallel": Parallel.FSDP,
        }
    )
    options = LaunchOptions(
        hours=5.5, max_cost=100.0, preemption_rate=0.2, learn=True, recovery_minutes=7.0,
        ckpt_seconds=45.0, template=repo / "task.yaml.j2", recovery_delay=0.5,
        chaos_preempt_after=12.0, preflight_always=True, hourly_price=1.5,
        hazards_from=(tmp_path / "trace.json",), steps=1000, minimize="time", params=1e9,
        flops_per_step=1e15, tokens_per_step=4096, seq_len=2048, layers=24, hidden=2048,
        recompute="selective", micro_batches=4, grad_bytes=1e9, cluster=True, idle_minutes=45,
    )  # fmt: skip
    # Every field differs from its default, so a new option cannot be forgotten here.
    defaults = {"script", "workdir", "name", "accelerator"}  # required fields
    for field, info in JobSpec.model_fields.items():
        if field not in defaults:
            assert getattr(spec, field) != info.get_default(call_default_factory=True), field
    for field, info in LaunchOptions.model_fields.items():
        assert getattr(options, field) != info.get_default(call_default_factory=True), field

    created = create_record(spec, "a: 1\n", None, "skypilot", launch_options=options)
    record = find_record(created.run_id)  # as stored on disk, not the object in hand
    git(repo, "commit", "-qam", "the checkout moves on")
    setup = prepare_rerun(record, tmp_path / "wt")

    rebuilt, wt = setup.spec, setup.worktree
    for field in JobSpec.model_fields:
        if field == "workdir":
            assert rebuilt.workdir == setup.workdir == wt
        elif field == "script":
            assert rebuilt.script == wt / "train.py"
            assert rebuilt.script.read_text() == "print('v2')\n"  # the recorded diff
        else:
            assert getattr(rebuilt, field) == getattr(spec, field), field
    assert (rebuilt.workdir / rebuilt.requirements).read_text() == "numpy\n"  # type: ignore[operator]
    for field in LaunchOptions.model_fields:
        if field == "template":
            assert setup.launch_options.template == wt / "task.yaml.j2"
        else:
            assert getattr(setup.launch_options, field) == getattr(options, field), field
    assert SECRET_VALUE not in json.dumps(record.model_dump(mode="json"))


# --------------------------------------------------------------------------- local backend e2e


@pytest.mark.slow
def test_local_run_records_preemption_segments(repo: Path, tmp_path: Path) -> None:
    import time

    # One step: --chaos-preempt-after counts from the first step a script reports (its
    # telemetry writes a launch's first step at once).
    (repo / "train.py").write_text(
        "import time\n"
        "from mncloud.telemetry.series import writer_from_env\n"
        "writer_from_env().add({'k': 'step', 't': time.time(), 'step': 1})\n"
        "time.sleep(5)\n"
    )
    bucket = tmp_path / "bucket"
    args = ["up", str(repo / "train.py"), "--cloud", "local", "--nodes", "2", "--gpus", "cpu:1"]
    args += ["--name", "e2e", "--bucket", f"file://{bucket}", "--detach", "--yes"]
    args += [
        "--chaos-preempt-after",
        "2s",
        "--recovery-delay",
        "0s",
        "--env",
        f"A_TOKEN={TOKEN_VALUE}",
        "--allow-secret-env",  # the user insists: records and logs must still scrub it
    ]
    code, _, err = cli(*args)
    assert code == 0, err
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        record = load_current("e2e")
        if record.finished:
            break
        time.sleep(0.5)
    kinds = [e.kind for e in record.events]
    assert kinds[0] == "launch" and "preemption" in kinds and kinds[-1] == "finish", kinds
    summary = cost_summary(record)
    assert len(summary.segments) >= 2
    assert summary.segments[0].ended_by == "preemption"
    assert any(e.node == 1 for e in record.events if e.kind == "preemption")
    stored = LaunchOptions.model_validate(record.launch_options)  # what `rerun` launches with
    assert (stored.chaos_preempt_after, stored.recovery_delay) == (2.0, 0.0)
    assert_no_planted(bucket, layout.records_root())
