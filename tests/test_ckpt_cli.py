"""`mncloud ckpt ls|verify|rm|pull` through Typer's CliRunner, over real buckets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from mncloud.backends import registry
from mncloud.backends.base import RunState, RunStatus
from mncloud.cli.ckpt import app
from mncloud.errors import CheckpointError
from mncloud.storage.checkpoints import (
    COMPLETE,
    CheckpointStore,
    FileEntry,
    Manifest,
    hash_bytes,
    hash_file,
    sha256_file,
)

runner = CliRunner()


def _fake_step(store: CheckpointStore, step: int, tmp: Path, *, complete: bool = True) -> None:
    """A step written the way CheckpointManager writes one, without torch."""
    files = {}
    for name, data in ((".metadata", b"meta" * 10), ("__0_0.distcp", bytes(range(256)) * 40)):
        path = tmp / f"{step}{name}"
        path.write_bytes(data)
        files[name] = path
    entries = store.upload(step, files)
    assert entries[".metadata"] == FileEntry.of(40, hash_file(files[".metadata"]))
    if complete:
        store.commit(Manifest(step=step, world_size=1, files=entries))


@pytest.fixture
def filled(bucket_uri: str, tmp_path: Path) -> str:
    store = CheckpointStore(bucket_uri)
    for step in (10, 20):
        _fake_step(store, step, tmp_path)
    _fake_step(store, 30, tmp_path, complete=False)
    return bucket_uri


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert res.exit_code == 2 and "__0_0.distcp xxh3_128 differs" in res.stderr


@pytest.mark.slow
def test_rm(filled: str) -> None:
    res = runner.invoke(app, ["rm", filled, "10"], input="n\n")
    assert res.exit_code == 1
    res = runner.invoke(app, ["rm", filled, "10", "--yes"])
    assert res.exit_code == 0, res.output
    assert [s.step for s in CheckpointStore(filled).steps()] == [20, 30]
    assert runner.invoke(app, ["rm", filled, "99", "--yes"]).exit_code == 2


@pytest.mark.slow
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


@pytest.mark.slow
def test_ckpt_cli_does_not_import_torch() -> None:
    code = "import sys, mncloud.cli.ckpt, mncloud.storage; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _RunBackend:
    """A registered backend whose runs keep their checkpoints where `CKPT` says."""

    name = "ckpt-test"
    CKPT: ClassVar[dict[str, str | None]] = {}

    def status(self, run_name: str) -> RunStatus:
        return RunStatus(
            name=run_name, backend=self.name, state=RunState.RUNNING, nodes=1,
            ckpt_uri=self.CKPT[run_name],
        )  # fmt: skip


@pytest.fixture
def run_backend(monkeypatch: pytest.MonkeyPatch) -> type[_RunBackend]:
    monkeypatch.setitem(registry._REGISTRY, _RunBackend.name, f"{__name__}:_RunBackend")
    monkeypatch.setattr(_RunBackend, "CKPT", {})
    return _RunBackend


def test_a_run_name_means_its_checkpoints(filled: str, run_backend: type[_RunBackend]) -> None:
    """`ckpt ls demo` reads the run's recorded checkpoint location (#17)."""
    registry.record_backend("demo", run_backend.name)
    run_backend.CKPT["demo"] = filled
    res = runner.invoke(app, ["ls", "demo", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in json.loads(res.stdout)] == [10, 20, 30]
    assert "step 20: ok" in runner.invoke(app, ["verify", "demo", "20"]).stdout
    registry.record_backend("bare", run_backend.name)
    run_backend.CKPT["bare"] = None
    res = runner.invoke(app, ["ls", "bare"])
    assert res.exit_code == 2 and "without a bucket" in res.stderr


@pytest.mark.parametrize(
    "args",
    [["ls", "{x}"], ["verify", "{x}"], ["rm", "{x}", "1", "--yes"], ["pull", "{x}", "1", "out"]],
)
def test_a_missing_location_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    for where in (str(tmp_path / "nonexistent"), f"file://{tmp_path}/nope", "no-such-run"):
        res = runner.invoke(app, [a.format(x=where) for a in args])
        assert res.exit_code == 2, (where, res.output)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
        assert res.stdout == ""


def test_a_directory_is_a_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_step(CheckpointStore(f"file://{tmp_path / 'ckpt'}"), 5, tmp_path)
    res = runner.invoke(app, ["ls", str(tmp_path / "ckpt"), "--json"])
    assert res.exit_code == 0 and [r["step"] for r in json.loads(res.stdout)] == [5]
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["ls", "empty"])  # no run of that name: the directory
    assert res.exit_code == 0, res.output
    assert f"no checkpoints at file://{tmp_path}/empty" in res.stdout.splitlines()


def test_paths_are_printed_whole_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path longer than the terminal is never wrapped or cut (a user copies it): on a line
    of its own (`soft_wrap`) and in a table's cell (`print_whole`), the terminal folds it."""
    import io

    from rich.console import Console
    from rich.table import Table

    from mncloud.cli._common import print_whole

    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "empty"
    deep.mkdir(parents=True)
    monkeypatch.setenv("COLUMNS", "80")
    res = runner.invoke(app, ["ls", str(deep)])
    assert res.exit_code == 0, res.output
    assert f"no checkpoints at file://{deep}" in res.stdout.splitlines()
    out = io.StringIO()
    table = Table("check", "detail")
    table.add_row("bucket", f"file://{deep} is reachable and writable")
    print_whole(table, Console(file=out, width=80, color_system=None))
    assert any(f"file://{deep} is reachable" in line for line in out.getvalue().splitlines())
    narrow = io.StringIO()  # a table that fits is printed as before
    print_whole(Table("a", "b"), Console(file=narrow, width=80, color_system=None))
    assert max(len(line) for line in narrow.getvalue().splitlines()) <= 80


def test_a_malformed_manifest_names_the_field() -> None:
    good = Manifest(step=3, world_size=1, files={"a": FileEntry.of(1, "0" * 32)})
    assert Manifest.from_bytes(good.to_bytes()) == good
    raw = json.loads(good.to_bytes())
    assert sorted(raw) == [
        "extra", "files", "format", "mncloud_version", "step", "torch_version", "wall_time",
        "world_size",
    ]  # fmt: skip
    for change, field in (
        ({"world_size": "two"}, "world_size"),
        ({"files": {"a": {"size": 1}}}, "files.a"),
        ({"files": {"a": {"size": 1, "sha256": "0", "xxh3_128": "0"}}}, "files.a"),
        ({"surprise": 1}, "surprise"),
    ):
        with pytest.raises(CheckpointError, match=rf"manifest.json is not valid: {field}: "):
            Manifest.from_bytes(json.dumps({**raw, **change}).encode())
    with pytest.raises(CheckpointError, match="not valid"):
        Manifest.from_bytes(b"{")


def _old_step(store: CheckpointStore, step: int, tmp: Path) -> None:
    """A step as mncloud wrote them before format 2: sha256 in every entry, format 1."""
    entries = {}
    for name, data in ((".metadata", b"meta" * 10), ("__0_0.distcp", bytes(range(256)) * 40)):
        path = tmp / f"old{step}{name}"
        path.write_bytes(data)
        store.bucket.put_file(store.key(step, name), path)
        entries[name] = {"size": len(data), "sha256": sha256_file(path)}
    raw = {"step": step, "world_size": 1, "files": entries, "format": 1, "extra": {},
           "mncloud_version": "0.1.0", "torch_version": "", "wall_time": 0.0}  # fmt: skip
    store.commit(Manifest.from_bytes(json.dumps(raw).encode()))
    assert json.loads(store.bucket.get_bytes(store.key(step, "manifest.json")))["files"] == entries


@pytest.mark.slow
def test_a_sha256_manifest_of_format_1_still_verifies(bucket_uri: str, tmp_path: Path) -> None:
    store = CheckpointStore(bucket_uri)
    _old_step(store, 7, tmp_path)
    assert store.read_manifest(7).files["__0_0.distcp"].algo == "sha256"
    assert store.verify(7, content=True).ok
    res = runner.invoke(app, ["pull", bucket_uri, "7", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    key = store.key(7, "__0_0.distcp")
    raw = bytearray(store.bucket.get_bytes(key))
    raw[5] ^= 1
    store.bucket.put_bytes(key, bytes(raw))
    assert store.verify(7).ok  # sizes only
    assert store.verify(7, content=True).reason == "__0_0.distcp sha256 differs from the manifest"
    res = runner.invoke(app, ["pull", bucket_uri, "7", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "sha256 differs" in res.stderr


def test_new_manifests_record_xxh3_128(filled: str) -> None:
    store = CheckpointStore(filled)
    manifest = store.read_manifest(20)
    assert manifest.format == 2
    raw = json.loads(store.bucket.get_bytes(store.key(20, "manifest.json")))
    data = store.bucket.get_bytes(store.key(20, "__0_0.distcp"))
    assert raw["files"]["__0_0.distcp"] == {"size": len(data), "xxh3_128": hash_bytes(data)}
    assert len(raw["files"]["__0_0.distcp"]["xxh3_128"]) == 32
