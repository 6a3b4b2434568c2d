"""`mncloud export` and `up --export-on-finish`: the exported weights are bitwise the model that
`CheckpointManager.load` restores; bad input is one line and exit 2 with nothing left behind.

The fast tests export a checkpoint one process wrote; the slow ones train the demo model
(`examples/train_ddp.py`) on the local backend, 2 nodes × 2 processes, with its checkpoints in a
local folder or on the real S3 test server, and export it at the end of the run and again here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from mncloud.cli import app
from mncloud.export import EXPORT_MANIFEST, INDEX_FILE, ExportManifest
from mncloud.records.store import load_current
from mncloud.storage import CheckpointStore, open_bucket
from mncloud.storage.checkpoints import COMPLETE, sha256_file, step_dir
from mncloud.train import CheckpointManager
from tests.test_local import cli as succeeded

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
HIDDEN = 32
runner = CliRunner()


def _demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_ddp_demo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _demo()


def run_cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


ok = succeeded  # tests/test_local.py's: `mncloud ARGS`, asserted to exit 0


def restored(uri: str, step: int | None = None) -> dict[str, torch.Tensor]:
    """The demo model's weights as `CheckpointManager.load` restores them (one process)."""
    model = demo.make_model(HIDDEN)
    state = {"model": model, "optimizer": torch.optim.AdamW(model.parameters())}
    ckpt = CheckpointManager(uri, keep=2, watch_preemption=False)
    try:
        loaded = ckpt.load(state, step=step)
    finally:
        ckpt.close()
    assert loaded is not None
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load_export(folder: Path) -> dict[str, torch.Tensor]:
    """The exported weights, loaded into a fresh demo model (every key, strict)."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(f))
    else:
        tensors = torch.load(folder / "model.pt", weights_only=True)
    fresh = demo.make_model(HIDDEN)
    if all(t.dtype == torch.float32 for t in tensors.values()):
        fresh.load_state_dict(tensors, strict=True)
        return {k: v.detach().clone() for k, v in fresh.state_dict().items()}
    assert set(tensors) == set(fresh.state_dict())
    return tensors


def assert_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype, key
        assert torch.equal(got[key], tensor), key


def assert_manifest(folder: Path, step: int, uri: str) -> ExportManifest:
    """export.json names the step, the checkpoint's manifest hash and each file's sha256."""
    manifest = ExportManifest.model_validate_json((folder / EXPORT_MANIFEST).read_bytes())
    assert manifest.step == step and manifest.source == uri and manifest.entry == "model"
    store = CheckpointStore(uri)
    marker = json.loads(store.bucket.get_bytes(store.key(step, COMPLETE)))
    assert manifest.checkpoint_manifest_sha256 == marker["manifest_sha256"]
    on_disk = {p.name for p in folder.iterdir()} - {EXPORT_MANIFEST}
    assert set(manifest.files) == on_disk
    for name, entry in manifest.files.items():
        assert sha256_file(folder / name) == entry.sha256
        assert (folder / name).stat().st_size == entry.size
    return manifest


def download(uri: str, folder: Path) -> Path:
    """Every object under a bucket URL (s3:// or file://), into `folder`."""
    bucket, prefix = open_bucket(uri)
    base = f"{prefix}/" if prefix else ""
    folder.mkdir()
    for obj in bucket.list(base):
        bucket.get_file(obj.key, folder / obj.key.removeprefix(base))
    return folder


# --------------------------------------------------------------------------- fast


@pytest.fixture
def saved(tmp_path: Path) -> tuple[str, dict[int, dict[str, torch.Tensor]]]:
    """Checkpoints of steps 1 and 2 of the demo model (one process), and its weights at each."""
    uri = f"file://{tmp_path / 'ckpt'}"
    torch.manual_seed(0)
    model = demo.make_model(HIDDEN)
    opt = torch.optim.AdamW(model.parameters())
    weights = {}
    ckpt = CheckpointManager(uri, interval_steps=1, keep=3, async_upload=False)
    for step in (1, 2):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        ckpt.save(step, {"model": model, "optimizer": opt, "note": "x"})
        weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt.close()
    return uri, weights


def test_latest_as_safetensors_torch_and_bf16(saved: Any, tmp_path: Path) -> None:
    uri, weights = saved
    ok("export", uri, "--out", str(tmp_path / "st"))
    assert_bitwise(load_export(tmp_path / "st"), weights[2])
    assert_manifest(tmp_path / "st", 2, uri)
    ok("export", uri, "1", "--out", str(tmp_path / "pt"), "--format", "torch")
    assert_bitwise(load_export(tmp_path / "pt"), weights[1])
    ok("export", uri, "latest", "--out", str(tmp_path / "bf"), "--dtype", "bfloat16")
    got = load_export(tmp_path / "bf")
    for key, tensor in weights[2].items():
        assert got[key].dtype == torch.bfloat16
        assert torch.equal(got[key], tensor.to(torch.bfloat16)), key  # round to nearest
        assert torch.allclose(got[key].float(), tensor, rtol=2**-8, atol=0), key
    assert assert_manifest(tmp_path / "bf", 2, uri).dtypes == ["bfloat16"]


def test_sharded_with_an_index_and_overwrite(saved: Any, tmp_path: Path) -> None:
    uri, weights = saved
    out = tmp_path / "sharded"
    ok("export", uri, "--out", str(out), "--max-shard-size", "5KB", "--json")
    index = json.loads((out / INDEX_FILE).read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 2 and set(index["weight_map"].values()) == set(shards)
    assert set(index["weight_map"]) == set(weights[2])
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in weights[2].values())
    assert_bitwise(load_export(out), weights[2])
    ok("export", uri, "1", "--out", str(out), "--overwrite")  # one file replaces the shards
    assert sorted(p.name for p in out.iterdir()) == [EXPORT_MANIFEST, "model.safetensors"]
    assert_bitwise(load_export(out), weights[1])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_latest_skips_a_torn_step_and_a_named_torn_step_is_refused(
    saved: Any, tmp_path: Path
) -> None:
    uri, weights = saved
    store = CheckpointStore(uri)
    store.bucket.delete(store.key(2, COMPLETE))  # step 2 torn: as if its save never finished
    ok("export", uri, "--out", str(tmp_path / "a"))
    assert_bitwise(load_export(tmp_path / "a"), weights[1])
    result = run_cli("export", uri, "2", "--out", str(tmp_path / "b"))
    assert result.exit_code == 2
    assert "COMPLETE missing" in result.stderr and not (tmp_path / "b").exists()


def _corrupt(uri: str, step: int) -> None:
    """Flip bytes of the step's biggest shard, keeping its size (only the hash can tell)."""
    folder = Path(uri.removeprefix("file://")) / step_dir(step)
    shard = max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


BAD = {
    "unknown run": (["no-such-run"], "no-such-run"),
    "unknown step": (["{uri}", "7"], "no such step"),
    "bad step": (["{uri}", "newest"], "STEP must be"),
    "unknown format": (["{uri}", "--format", "onnx"], "--format 'onnx' is unknown"),
    "unknown dtype": (["{uri}", "--dtype", "int8"], "--dtype 'int8' is unknown"),
    "no such entry": (["{uri}", "--only", "ema"], "no 'ema' entry (it holds: model, optimizer)"),
    "not empty": (["{uri}", "--out", "{full}"], "not empty; add --overwrite"),
    "corrupt": (["{uri}", "--corrupt"], "differs from the manifest"),
    "bad size": (["{uri}", "--max-shard-size", "5 parsecs"], "write a size like"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    case: str, saved: Any, tmp_path: Path
) -> None:
    uri, _ = saved
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    args, reason = BAD[case]
    args = [a.format(uri=uri, full=full) for a in args]
    if "--corrupt" in args:
        args.remove("--corrupt")
        _corrupt(uri, 2)
    out = tmp_path / "new" / "out"
    if "--out" not in args:
        args += ["--out", str(out)]
    result = run_cli("export", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and reason in lines[0], lines
    assert "Traceback" not in result.output and result.stdout == ""
    assert not (tmp_path / "new").exists()  # not even the parent folder it would have made
    assert sorted(p.name for p in full.iterdir()) == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_export_to_and_from_s3(saved: Any, s3_env: Any, tmp_path: Path) -> None:
    """A checkpoint in the real S3 server, exported into another S3 folder and read back."""
    uri, weights = saved
    bucket = s3_env.make_bucket()
    store = CheckpointStore(f"s3://{bucket}/runs/demo")
    local = CheckpointStore(uri)
    for step in (1, 2):
        files = {p.name: p for p in (Path(uri.removeprefix("file://")) / step_dir(step)).iterdir()}
        manifest = local.read_manifest(step)
        store.upload(step, {k: v for k, v in files.items() if k in manifest.files})
        store.commit(manifest)
    out = f"s3://{bucket}/exports/m"
    ok("export", store.uri, "--out", out, "--format", "torch")
    result = run_cli("export", store.uri, "--out", out)
    assert result.exit_code == 2 and "not empty" in result.stderr
    ok("export", store.uri, "--out", out, "--overwrite")
    s3, prefix = open_bucket(out)
    names = sorted(o.key.removeprefix(prefix + "/") for o in s3.list(prefix + "/"))
    assert names == [EXPORT_MANIFEST, "model.safetensors"]  # the torch file went with --overwrite
    pulled = download(out, tmp_path / "pulled")
    assert_bitwise(load_export(pulled), weights[2])
    manifest = ExportManifest.model_validate_json((pulled / EXPORT_MANIFEST).read_bytes())
    assert manifest.source == store.uri and manifest.step == 2
    assert manifest.files["model.safetensors"].sha256 == sha256_file(pulled / "model.safetensors")


@pytest.mark.catalog
@pytest.mark.parametrize("recovery", ["gang", "node"])
def test_the_run_script_exports_on_node_0_after_success(recovery: str) -> None:
    from mncloud.export import ExportFormat
    from mncloud.render import render
    from mncloud.request import build_spec

    spec = build_spec(EXAMPLE, gpus="cpu:2", nodes=2, cloud="local", recovery=recovery)
    assert "mncloud export" not in render(spec).yaml_text
    spec = spec.model_copy(update={"export_on_finish": ExportFormat.TORCH})
    text = render(spec).yaml_text
    line = (
        'python -m mncloud export "$MNCLOUD_CKPT_URI" latest --out "$MNCLOUD_CKPT_URI/"export '
        "--format torch --overwrite \\"
    )
    assert line in text
    after = text[text.index(line) + len(line) :].lstrip()
    assert after.startswith('|| echo "mncloud: the export on finish failed')  # never fails the run
    node0 = "$MNCLOUD_REPLICA_ID" if recovery == "node" else "$NODE_RANK"
    assert f'[ "$rc" = 0 ] && [ "{node0}" = 0 ]' in text
    assert text.index("exit 115") < text.index(line) < text.rindex('exit "$rc"')


@pytest.mark.catalog
@pytest.mark.parametrize(
    "flags,reason",
    [
        (
            ["--cloud", "local", "--export-on-finish", "onnx"],
            "--export-on-finish 'onnx' is unknown",
        ),
        (["--cloud", "aws", "--export-on-finish", "torch"], "--export-on-finish needs --bucket"),
    ],
)
def test_up_refuses_a_bad_export_on_finish(flags: list[str], reason: str) -> None:
    result = run_cli("up", str(EXAMPLE), "--gpus", "cpu:2", "--dryrun", "--yes", *flags)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and reason in result.stderr


# --------------------------------------------------------------------------- slow: real runs

TRAIN_ARGS = ["--steps", "30", "--ckpt-interval", "10", "--hidden", str(HIDDEN),
              "--log-every", "10"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_2x2_run_exports_on_finish_and_on_demand(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from mncloud.backends.base import RunState
    from tests.test_local import run_log, up, wait_final

    name = f"exp-{where}"
    flags = ["--nodes", "2", "--gpus", "cpu:2", "--export-on-finish", "safetensors"]
    if where == "s3":
        bucket = request.getfixturevalue("s3_env").make_bucket()
        flags += ["--bucket", f"s3://{bucket}/team"]
    up(name, EXAMPLE, *flags, script_args=TRAIN_ARGS)
    state = wait_final(name)
    assert state.state is RunState.SUCCEEDED, run_log(name)
    uri = state.ckpt_uri
    want = restored(uri)
    store = CheckpointStore(uri)
    assert store.latest()[0] == 30

    # up --export-on-finish: node 0 exported into <checkpoints>/export, and the record says so.
    finished = download(f"{uri}/export", tmp_path / "finished")
    assert (finished / EXPORT_MANIFEST).is_file(), run_log(name)[-3000:]
    assert_bitwise(load_export(finished), want)
    assert assert_manifest(finished, 30, uri).run == name
    record = load_current(name)
    exports = [e for e in record.events if e.kind == "export"]
    assert len(exports) == 1 and exports[0].step == 30 and record.finished
    assert exports[0].detail.startswith("safetensors as saved → ")
    assert exports[0].detail.endswith(f"{uri.removeprefix('file://')}/export")

    # mncloud export by the run's name and by its URI: safetensors, torch, bfloat16.
    ok("export", name, "--out", str(tmp_path / "st"))
    assert_bitwise(load_export(tmp_path / "st"), want)
    assert assert_manifest(tmp_path / "st", 30, uri).run == name
    ok("export", uri, "latest", "--out", str(tmp_path / "pt"), "--format", "torch")
    assert_bitwise(load_export(tmp_path / "pt"), want)
    ok("export", uri, "20", "--out", str(tmp_path / "bf"), "--dtype", "bfloat16")
    older = restored(uri, step=20)
    got = load_export(tmp_path / "bf")
    assert_bitwise(got, {k: v.to(torch.bfloat16) for k, v in older.items()})
