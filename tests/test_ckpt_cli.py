"""`mncloud ckpt ls|verify|rm|pull` through Typer's CliRunner, over real buckets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud.ckptstore import COMPLETE, CheckpointStore, FileEntry, Manifest, sha256_file
from mncloud.cli.ckpt import app

runner = CliRunner()


def _fake_step(store: CheckpointStore, step: int, tmp: Path, *, complete: bool = True) -> None:
    """A step written the way CheckpointManager writes one, without torch."""
    files = {}
    for name, data in ((".metadata", b"meta" * 10), ("__0_0.distcp", bytes(range(256)) * 40)):
        path = tmp / f"{step}{name}"
        path.write_bytes(data)
        files[name] = path
    entries = store.upload(step, files)
    assert entries[".metadata"] == FileEntry(40, sha256_file(files[".metadata"]))
    if complete:
        store.commit(Manifest(step=step, world_size=1, files=entries))


@pytest.fixture
def filled(bucket_uri: str, tmp_path: Path) -> str:
    store = CheckpointStore(bucket_uri)
    for step in (10, 20):
        _fake_step(store, step, tmp_path)
    _fake_step(store, 30, tmp_path, complete=False)
    return bucket_uri


def test_ls(filled: str) -> None:
    res = runner.invoke(app, ["ls", filled, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["step"], r["complete"], r["files"]) for r in rows] == [
        (10, True, 4),
        (20, True, 4),
        (30, False, 2),
    ]
    res = runner.invoke(app, ["ls", filled])
    assert res.exit_code == 0 and "30" in res.stdout


def test_verify_and_corruption(filled: str) -> None:
    res = runner.invoke(app, ["verify", filled, "20"])
    assert res.exit_code == 0 and "step 20: ok" in res.stdout
    res = runner.invoke(app, ["verify", filled, "--json"])
    assert res.exit_code == 0, res.output
    assert {v["step"]: v["ok"] for v in json.loads(res.stdout)} == {30: False, 20: True, 10: True}
    store = CheckpointStore(filled)
    key = store.key(20, "__0_0.distcp")
    raw = bytearray(store.bucket.get_bytes(key))
    raw[0] ^= 1
    store.bucket.put_bytes(key, bytes(raw))
    assert runner.invoke(app, ["verify", filled, "20", "--quick"]).exit_code == 0
    res = runner.invoke(app, ["verify", filled, "20"])
    assert res.exit_code == 2 and "sha256" in res.stderr


def test_rm(filled: str) -> None:
    res = runner.invoke(app, ["rm", filled, "10"], input="n\n")
    assert res.exit_code == 1
    res = runner.invoke(app, ["rm", filled, "10", "--yes"])
    assert res.exit_code == 0, res.output
    assert [s.step for s in CheckpointStore(filled).steps()] == [20, 30]
    assert runner.invoke(app, ["rm", filled, "99", "--yes"]).exit_code == 2


def test_pull(filled: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    res = runner.invoke(app, ["pull", filled, "latest", str(dest)])
    assert res.exit_code == 0, res.output
    assert "pulled step 20" in res.stdout
    assert sorted(p.name for p in dest.iterdir()) == [".metadata", "__0_0.distcp", "manifest.json"]
    store = CheckpointStore(filled)
    store.bucket.delete(store.key(10, COMPLETE))
    res = runner.invoke(app, ["pull", filled, "10", str(tmp_path / "x")])
    assert res.exit_code == 2 and "COMPLETE missing" in res.stderr


def test_ckpt_cli_does_not_import_torch() -> None:
    code = "import sys, mncloud.cli.ckpt, mncloud.ckptstore; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
