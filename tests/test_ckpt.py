"""CheckpointManager against real buckets (s3, gs, file): round trip, exact resume, torn steps,
retention, a failed upload, and a 2-process gloo run under torchrun."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="mncloud.train needs torch (pip install mncloud[train])"
)
np = pytest.importorskip("numpy")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from mncloud.errors import CheckpointError  # noqa: E402
from mncloud.storage import set_simulated_outage  # noqa: E402
from mncloud.storage.checkpoints import COMPLETE, MANIFEST, CheckpointStore, Manifest  # noqa: E402
from mncloud.train import CheckpointManager, ResumableSampler, seed_everything  # noqa: E402

from .servers import free_port  # noqa: E402


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)
    )


def _train(uri: str, total: int, *, stop: int | None = None, interval: int = 3) -> list:
    """A small loop that uses every RNG; stops (closing the manager) after `stop` steps."""
    seed_everything(0, threads=1)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(40, 8, generator=g), torch.randn(40, 1, generator=g))
    sampler = ResumableSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, generator=torch.Generator())
    state = {"model": model, "optimizer": opt, "sampler": sampler, "data": {"seen": 0}}
    with CheckpointManager(uri, interval_steps=interval, keep=2) as ckpt:
        step = ckpt.load(state) or 0
        while step < total:
            for x, y in loader:
                jitter = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
                loss = ((model(x) - y) ** 2).mean() + jitter
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                state["data"]["seen"] += len(x)
                ckpt.maybe_save(step, state, force=step == stop)
                if step in (stop, total):
                    break
            if step == stop:
                break
    return [p.detach().clone() for p in model.parameters()] + [state["data"]["seen"]]


def _save(uri: str, step: int, state: dict, **kw) -> None:
    with CheckpointManager(uri, keep=kw.pop("keep", 5), **kw) as ckpt:
        assert ckpt.save(step, state, wait=True)


@pytest.mark.slow
def test_round_trip(bucket_uri: str) -> None:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    ema = torch.arange(5.0)
    state = {"model": model, "optimizer": opt, "step": 7, "data": {"pos": 123}, "ema": ema}
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    _save(bucket_uri, 7, state)
    expected_rand = (random.random(), float(np.random.rand()), torch.rand(1).item())

    model2 = _model()
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    data2 = {"pos": 0}
    ema2 = torch.zeros(5)
    state2 = {"model": model2, "optimizer": opt2, "step": 0, "data": data2, "ema": ema2}
    with CheckpointManager(bucket_uri) as ckpt:
        assert ckpt.load(state2) == 7
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected_rand
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)
    assert state2["step"] == 7 and data2 == {"pos": 123} and state2["data"] is data2
    assert torch.equal(ema2, ema)

    manifest = CheckpointStore(bucket_uri).read_manifest(7)
    assert manifest.world_size == 1 and manifest.torch_version == torch.__version__
    assert {".metadata", "rank_0.pt"} <= set(manifest.files)


@pytest.mark.slow
def test_resume_is_bitwise_identical(bucket_uri: str) -> None:
    straight = _train(bucket_uri + "/straight", 16)
    _train(bucket_uri + "/resumed", 16, stop=8)
    resumed = _train(bucket_uri + "/resumed", 16)
    assert straight[-1] == resumed[-1] == 16 * 4
    for a, b in zip(straight[:-1], resumed[:-1], strict=True):
        assert torch.equal(a, b)


def _tear(store: CheckpointStore, step: int, how: str) -> None:
    b = store.bucket
    if how == "no-complete":
        b.delete(store.key(step, COMPLETE))
    elif how == "truncated-shard":
        key = store.key(step, "__0_0.distcp")
        b.put_bytes(key, b.get_bytes(key)[:-100])
    elif how == "lying-manifest":
        m = Manifest.from_bytes(b.get_bytes(store.key(step, MANIFEST)))
        entry = m.files["__0_0.distcp"]
        m.files["__0_0.distcp"] = dataclasses.replace(entry, size=entry.size + 1)
        store.commit(m)  # a consistent COMPLETE, but the manifest lies about a size
    elif how in ("corrupt-bytes", "corrupt-shard"):  # same size, other content: hashes see it
        key = store.key(step, "rank_0.pt" if how == "corrupt-bytes" else "__0_0.distcp")
        raw = bytearray(b.get_bytes(key))
        raw[len(raw) // 2] ^= 0xFF
        b.put_bytes(key, bytes(raw))


@pytest.mark.slow
def test_torn_steps_are_never_loaded(bucket_uri: str, caplog) -> None:
    """Every kind of torn step is skipped with its reason, the next older one loaded. A flipped
    byte is seen without `verify_sha256`: the extras by their hash, a shard's bytes by the
    chunk hash of the range a rank reads (the file and bytes named)."""
    model = _model()
    state = {"model": model, "step": 0}
    for step in (1, 2, 3, 4, 5, 6):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step)
        _save(bucket_uri, step, state, keep=10)
    store = CheckpointStore(bucket_uri)
    _tear(store, 6, "no-complete")
    _tear(store, 5, "truncated-shard")
    _tear(store, 4, "lying-manifest")
    _tear(store, 3, "corrupt-bytes")
    _tear(store, 2, "corrupt-shard")

    target = {"model": _model(), "step": -1}
    with caplog.at_level(logging.WARNING), CheckpointManager(bucket_uri) as ckpt:
        assert ckpt.load(target) == 1
    assert "step 6 skipped: COMPLETE missing" in caplog.text
    assert "step 5 skipped: __0_0.distcp is" in caplog.text
    assert "step 4 skipped: __0_0.distcp is" in caplog.text
    assert "step 3 skipped: rank 0: rank_0.pt xxh3_128 differs from the manifest" in caplog.text
    assert re.search(r"step 2 skipped: rank 0: __0_0.distcp bytes \d+-\d+ fail their xxh3_128",
                     caplog.text), caplog.text  # fmt: skip
    assert all(float(p.detach().flatten()[0]) == 1.0 for p in target["model"].parameters())

    with CheckpointManager(bucket_uri, verify_sha256=True) as ckpt:
        assert ckpt.load(target) == 1
    assert all(float(p.detach().flatten()[0]) == 1.0 for p in target["model"].parameters())
    with CheckpointManager(bucket_uri) as ckpt, pytest.raises(CheckpointError):
        ckpt.load(target, step=5)


@pytest.mark.slow
def test_retention_keeps_last_k_and_cleans_torn(bucket_uri: str) -> None:
    state = {"model": _model(), "step": 0}
    with CheckpointManager(bucket_uri, keep=2) as ckpt:
        for step in (1, 2):
            assert ckpt.save(step, state, wait=True)
    store = CheckpointStore(bucket_uri)
    _tear(store, 2, "no-complete")  # torn, older than what comes next
    with CheckpointManager(bucket_uri, keep=2) as ckpt:
        for step in (3, 4, 5):
            assert ckpt.save(step, state, wait=True)
    # A torn step newer than the newest verified one may still be uploading: it stays.
    store.bucket.put_bytes(store.key(9, "__0_0.distcp"), b"partial")
    store.retain(2)
    assert [(s.step, s.complete) for s in store.steps()] == [(4, True), (5, True), (9, False)]
    with pytest.raises(CheckpointError):
        CheckpointManager(bucket_uri, keep=1)


def test_retention_never_drops_newest_verified(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'b'}"
    state = {"model": _model(), "step": 0}
    for step in (1, 2, 3, 4):
        _save(uri, step, state, keep=10)
    store = CheckpointStore(uri)
    _tear(store, 4, "truncated-shard")  # the newest complete step is corrupt: 3 must stay
    assert store.retain(2) == [1]
    assert [s.step for s in store.steps()] == [2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "folder"])
def test_failed_upload_keeps_previous_step(s3_env, caplog, stream: bool) -> None:
    """The server dies while step 2 uploads (at its second part): step 1 stays the one that
    loads; training goes on; the next interval saves again once the server is back."""
    uri = f"s3://{s3_env.make_bucket()}/run"
    big = torch.nn.Linear(2048, 4096)  # 32 MiB of weights: a multipart upload of 3 parts
    state = {"model": big, "step": 0}
    parts: list[str] = []

    def kill_at_second_part(request, **_) -> None:  # botocore's hook, before a part is sent
        parts.append(request.url)
        if sum("step_00000002" in url for url in parts) == 2:
            s3_env.stop()

    with caplog.at_level(logging.WARNING):
        ckpt = CheckpointManager(uri, interval_steps=1, keep=2, retry_seconds=2)
        ckpt._saving.stream_uploads = stream
        ckpt.store.bucket.client.meta.events.register(
            "before-send.s3.UploadPart", kill_at_second_part
        )
        assert ckpt.save(1, state, wait=True)
        assert ckpt.save(2, state)  # returns at once
        assert ckpt.last_stall_s < 5
        ckpt.wait()  # the failure is logged, not raised
        assert "checkpoint step 2 failed" in caplog.text
        s3_env.start()
        assert CheckpointStore(uri).latest()[0] == 1
        assert ckpt.maybe_save(3, state)
        ckpt.close()
    assert CheckpointStore(uri).latest()[0] == 3
    assert ("hash_s" in ckpt.last_phases) == stream  # hash_s: the streamed path's phase


def test_file_outage_then_recovery(tmp_path: Path, caplog) -> None:
    uri = f"file://{tmp_path / 'b'}"
    state = {"model": _model(), "step": 0}
    with CheckpointManager(uri, interval_steps=1, retry_seconds=0.5) as ckpt:
        assert ckpt.save(1, state, wait=True)
        set_simulated_outage(uri, True)
        with caplog.at_level(logging.WARNING):
            ckpt.save(2, state, wait=True)
        assert "checkpoint step 2 failed" in caplog.text
        set_simulated_outage(uri, False)
        assert CheckpointStore(uri).latest()[0] == 1
        assert ckpt.save(3, state, wait=True)
    assert CheckpointStore(uri).latest()[0] == 3


DDP_SCRIPT = textwrap.dedent(
    """
    import logging, os, random, signal, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from mncloud.train import (CheckpointManager, ResumableSampler, cleanup, init_distributed,
                               is_main, seed_everything, wrap_ddp)

    logging.basicConfig(level=logging.INFO)
    uri, total, stop, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    init_distributed(backend="gloo", timeout_s=60)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(64, 1))
    seed_everything(0, threads=1)
    model = wrap_ddp(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(123)
    ds = TensorDataset(torch.randn(128, 16, generator=g), torch.randn(128, 1, generator=g))
    sampler = ResumableSampler(ds, seed=7)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, generator=torch.Generator())
    state = {"model": model, "optimizer": opt, "sampler": sampler}
    ckpt = CheckpointManager(uri, interval_steps=4, keep=2)
    step = ckpt.load(state) or 0
    while step < total:
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean() + random.random() * 1e-3
            opt.zero_grad(); loss.backward(); opt.step()
            step += 1
            ckpt.maybe_save(step, state)
            if step in (stop, total):
                break
        if step == stop:
            ckpt.save(step, state, wait=True)
            ckpt.close()
            os.kill(os.getpid(), signal.SIGKILL)  # die like a preempted VM
    ckpt.close()
    if is_main():
        torch.save([p.detach() for p in model.parameters()], out)
    cleanup()
    """
)


@pytest.mark.slow
def test_torchrun_two_ranks_resume_exactly(s3_env, tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not found beside the Python interpreter")
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    bucket = s3_env.make_bucket()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }

    def run(uri: str, total: int, stop: int, out: Path) -> subprocess.CompletedProcess:
        cmd = [str(torchrun), "--nnodes=1", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(script), uri, str(total), str(stop), str(out)]  # fmt: skip
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)

    straight = run(f"s3://{bucket}/straight", 20, 0, tmp_path / "a.pt")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "find_unused_parameters" not in straight.stderr  # wrap_ddp's exact mode is quiet
    killed = run(f"s3://{bucket}/resumed", 20, 10, tmp_path / "unused.pt")
    assert killed.returncode != 0  # SIGKILLed after its checkpoint
    store = CheckpointStore(f"s3://{bucket}/resumed")
    assert store.latest()[0] == 10
    manifest = store.read_manifest(10)
    assert manifest.world_size == 2 and {"rank_0.pt", "rank_1.pt"} <= set(manifest.files)
    resumed = run(f"s3://{bucket}/resumed", 20, 0, tmp_path / "b.pt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from checkpoint step 10" in resumed.stderr
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert json.loads(store.bucket.get_bytes(store.key(20, COMPLETE)))["step"] == 20
