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
        monkeypatch.setattr(reference, "_run", lambda *a: ran.append("run") or {})
        assert reference.reference_final(script, flags, train)["weights_sha256"] == "abc"
        assert ran == []  # read from the other worker's file
    finally:
        path.unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)
        path.parent.rmdir()


def test_outside_xdist_nothing_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    assert reference.shared_file(("script", "--", "--steps", "3")) is None
