"""`tests/reference.py` under pytest-xdist: a reference final one worker wrote is read by the
others, never run again (each worker is its own process with its own memory)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests import reference


def test_a_final_another_worker_wrote_is_read_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")
    monkeypatch.setattr(reference, "_finals", {})
    script, flags = Path("examples/train_ddp.py"), ["--nodes", "2"]
    train = ["--steps", "3", "--compute-ms", "50"]
    key = reference.reference_key(script, flags, train)
    assert key == (str(script), "--nodes", "2", "--", "--steps", "3")  # the sleep left out
    path = reference.shared_file(key)
    assert path is not None and path == reference.shared_file(key)
    try:
        path.write_text(json.dumps({"steps": 3, "weights_sha256": "abc"}))
        ran: list[str] = []
        monkeypatch.setattr(reference, "_start", lambda *a: ran.append("run") or Path())
        assert reference.reference_final(script, flags, train)["weights_sha256"] == "abc"
        assert ran == []  # read from the other worker's file
    finally:
        path.unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)
        path.parent.rmdir()


def test_outside_xdist_nothing_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    assert reference.shared_file(("script", "--", "--steps", "3")) is None


def test_a_reference_another_worker_started_is_waited_for_not_started_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`start_reference` beside a run: the worker that started the configuration's reference
    left its run folder; another worker waits on that run, then shares its final."""
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")
    monkeypatch.setattr(reference, "_finals", {})
    script, flags, train = Path("examples/train_ddp.py"), ["--nodes", "2"], ["--steps", "3"]
    path = reference.shared_file(reference.reference_key(script, flags, train))
    assert path is not None
    started = path.with_suffix(".started")
    try:
        started.write_text(str(tmp_path / "ref-7"))  # the other worker's run, still running
        ran: list[str] = []
        waited: list[Path] = []
        monkeypatch.setattr(reference, "_start", lambda *a: ran.append("run") or Path())
        monkeypatch.setattr(
            reference, "_wait", lambda folder: waited.append(folder) or {"weights_sha256": "d"}
        )
        final = reference.start_reference(script, flags, train)
        assert ran == [] and waited == []  # nothing started, nothing waited for yet
        assert final()["weights_sha256"] == "d" and waited == [tmp_path / "ref-7"]
        assert json.loads(path.read_text()) == {"weights_sha256": "d"}  # for the next worker
        assert reference.start_reference(script, flags, train)() == {"weights_sha256": "d"}
        assert waited == [tmp_path / "ref-7"]
    finally:
        for leftover in (path, started, path.with_suffix(".lock")):
            leftover.unlink(missing_ok=True)
        path.parent.rmdir()
