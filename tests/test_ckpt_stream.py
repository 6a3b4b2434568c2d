"""Checkpoints streamed into S3 multipart uploads (no local copy) against the local-folder path,
on the real S3 server: the same files, bit for bit, the same manifest shape, loads identical;
the fallback to the folder path when the bucket is not S3 or RAM is short."""

from __future__ import annotations

import io
import struct
import threading
import zipfile
from contextvars import ContextVar
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="mncloud.train needs torch")

from mncloud.storage.checkpoints import COMPLETE, MANIFEST, CheckpointStore  # noqa: E402
from mncloud.train import CheckpointManager  # noqa: E402

PART = 5 * 1024 * 1024
"""S3's smallest part (but the last)."""


def _per_thread_config() -> bool:
    """torch keeps config overrides per thread (2.13), so checkpoints leave out zip CRCs."""
    from torch.utils.serialization import config

    return isinstance(config._config["save.compute_crc32"].user_override, ContextVar)


def _tensor_crcs(blob: bytes) -> list[int]:
    """The CRC32 that each tensor record of the `torch.save` archives in `blob` (a DCP shard:
    one archive per tensor, back to back) names in its central directory entry."""
    crcs, at = [], blob.find(b"PK\x01\x02")
    while at >= 0:
        (crc,) = struct.unpack_from("<I", blob, at + 16)
        (n,) = struct.unpack_from("<H", blob, at + 28)
        if blob[at + 46 : at + 46 + n].startswith(b"archive/data/"):
            crcs.append(crc)
        at = blob.find(b"PK\x01\x02", at + 4)
    return crcs


def _state() -> dict:
    """Several parts' worth of weights (parts of `PART` bytes), a tensor smaller than a part,
    an optimizer's state and plain Python values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.Linear(2048, 7))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 1024)).sum().backward()
    opt.step()
    return {"model": model, "optimizer": opt, "step": 5, "data": {"pos": 17}}


def _save(uri: str, state: dict, *, stream: bool) -> dict[str, float]:
    with CheckpointManager(uri, keep=2) as ckpt:
        ckpt._saving.stream_uploads = stream
        ckpt.store.bucket.chunk_size = PART  # a shard of 5 parts
        ckpt.store.bucket.max_concurrency = 2  # fewer buffers than parts: the writer waits
        assert ckpt.save(5, state, wait=True)
        return dict(ckpt.last_phases)


def test_streamed_and_folder_checkpoints_are_identical(s3_env, tmp_path: Path) -> None:
    bucket = s3_env.make_bucket()
    streamed, folder = f"s3://{bucket}/streamed", f"s3://{bucket}/folder"
    state = _state()
    phases = _save(streamed, state, stream=True)
    assert "hash_s" in phases and "buffer_wait_s" in phases  # the streamed path was taken
    assert "hash_s" not in _save(folder, state, stream=False)

    a, b = CheckpointStore(streamed), CheckpointStore(folder)
    ma, mb = a.read_manifest(5), b.read_manifest(5)
    assert set(ma.files) == set(mb.files) >= {".metadata", "__0_0.distcp", "rank_0.pt"}
    assert ma.files["__0_0.distcp"].size > 4 * PART  # it was a multipart upload
    assert ma.model_dump().keys() == mb.model_dump().keys()
    for name in ("__0_0.distcp", "rank_0.pt"):  # .metadata names its folder and a random id
        assert ma.files[name] == mb.files[name]  # size and hash: the same bytes
    assert a.verify(5, content=True).ok and b.verify(5, content=True).ok
    listed = {o.key.rsplit("/", 1)[-1] for o in a.bucket.list(a.key(5))}
    assert listed == set(ma.files) | {MANIFEST, COMPLETE}  # no stray .tmp, no half upload
    crcs = _tensor_crcs(a.bucket.get_bytes(a.key(5, "__0_0.distcp")))
    assert len(crcs) >= 4 and all((crc == 0) == _per_thread_config() for crc in crcs)

    for uri in (streamed, folder):
        target = {"model": torch.nn.Sequential(torch.nn.Linear(1024, 2048),
                                               torch.nn.Linear(2048, 7)),
                  "step": 0, "data": {"pos": 0}}  # fmt: skip
        target["optimizer"] = torch.optim.Adam(target["model"].parameters(), lr=0.1)
        with CheckpointManager(uri, verify_sha256=True) as ckpt:
            assert ckpt.load(target) == 5
        for x, y in zip(state["model"].parameters(), target["model"].parameters(), strict=True):
            assert torch.equal(x, y)
        s1, s2 = state["optimizer"].state_dict(), target["optimizer"].state_dict()
        for k in s1["state"]:
            assert torch.equal(s1["state"][k]["exp_avg_sq"], s2["state"][k]["exp_avg_sq"])
        assert target["step"] == 5 and target["data"] == {"pos": 17}


def test_no_streaming_without_ram_or_s3(s3_env, tmp_path: Path, monkeypatch) -> None:
    import psutil

    state = _state()
    assert "hash_s" not in _save(f"file://{tmp_path / 'b'}", state, stream=True)
    real = psutil.virtual_memory()
    short = real._replace(available=64 * 1024 * 1024)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: short)
    uri = f"s3://{s3_env.make_bucket()}/r"
    assert "hash_s" not in _save(uri, state, stream=True)
    assert CheckpointStore(uri).verify(5, content=True).ok


def test_emergency_save_streams_beside_a_stuck_periodic_one(s3_env, tmp_path, monkeypatch) -> None:
    """A periodic save's parts hang (all its part buffers taken); a preemption notice comes:
    the emergency save streams through buffers of its own and is committed before the
    deadline."""
    import threading
    import time

    from mncloud import constants
    from mncloud.train.preempt import Notice, Preempted

    monkeypatch.setenv(constants.METADATA_PROTOCOL_ENV, "none")
    monkeypatch.setenv(constants.PREEMPT_MARKER_ENV, str(tmp_path / "marker"))
    uri = f"s3://{s3_env.make_bucket()}/r"
    state = _state()
    release = threading.Event()

    def hang_step_10(request, **_) -> None:  # botocore's hook, before a part is sent
        if "step_00000010" in request.url:
            release.wait(60)

    ckpt = CheckpointManager(uri, interval_steps=10, keep=2, watch_preemption=True)
    ckpt.store.bucket.chunk_size = PART
    ckpt.store.bucket.max_concurrency = 2  # 3 buffers for a shard of 5+ parts: it waits
    ckpt.store.bucket.client.meta.events.register("before-send.s3.UploadPart", hang_step_10)
    try:
        assert ckpt.maybe_save(10, state)
        t0 = time.time()
        ckpt.watcher.notify(Notice("manual", t0 + 20, t0))
        with pytest.raises(Preempted) as exc:
            ckpt.maybe_save(11, state)
        assert exc.value.committed == 11 and time.time() - t0 < 15
        assert "hash_s" in ckpt.last_phases  # streamed
    finally:
        release.set()
        ckpt.close()
    store = CheckpointStore(uri)
    assert store.latest()[0] == 11 and store.verify(11, content=True).ok
    assert store.read_manifest(11).extra.get("preemption") is True


def test_stream_file_system_parts_and_renamed_tmp_files(s3_env) -> None:
    """The DCP file system alone: a file of several parts, one smaller than a part, and a
    `.tmp` file larger than a part that is only sent, whole, under the name it is renamed to."""
    import os

    from mncloud.storage.checkpoints import FileEntry, hash_bytes
    from mncloud.storage.s3 import S3Bucket
    from mncloud.train.streaming import PartBuffers, S3StreamFileSystem

    bucket = S3Bucket(s3_env.make_bucket())
    fs = S3StreamFileSystem(bucket, lambda n: f"d/{n}", PartBuffers(PART, 2), workers=1)
    blobs = {"big": os.urandom(2 * PART + 7), "small": b"x" * 100, ".m.tmp": os.urandom(PART + 1)}
    for name, blob in blobs.items():
        with fs.create_stream(fs.concat_path("step", name), "wb") as stream:
            for at in range(0, len(blob), 1 << 20):  # DCP writes in pieces
                stream.write(blob[at : at + (1 << 20)])
    assert not bucket.exists("d/.m.tmp")
    fs.rename(fs.concat_path("step", ".m.tmp"), fs.concat_path("step", ".m"))
    entries = fs.finish()
    blobs[".m"] = blobs.pop(".m.tmp")
    assert set(entries) == set(blobs)
    for name, blob in blobs.items():
        assert bucket.get_bytes(f"d/{name}") == blob
        assert entries[name] == FileEntry.of(len(blob), hash_bytes(blob))
    assert [o.key for o in bucket.list("d/")] == ["d/.m", "d/big", "d/small"]


def test_zip_crc32_is_left_out_on_the_saving_thread_only() -> None:
    """A user's `torch.save` on the training thread during an async save keeps its CRCs; the
    checkpoint's archives lack them where torch keeps overrides per thread, and load alike."""
    from mncloud.train.saving import _without_zip_crc32

    def archive() -> bytes:
        buf = io.BytesIO()
        torch.save(torch.arange(1000.0), buf)
        return buf.getvalue()

    saved: dict[str, bytes] = {}
    inside, done = threading.Event(), threading.Event()

    def saver() -> None:
        with _without_zip_crc32():
            saved["checkpoint"] = archive()
            inside.set()
            done.wait(30)

    thread = threading.Thread(target=saver)
    thread.start()
    assert inside.wait(30)
    saved["user"] = archive()  # the training thread, while the save's override is in force
    done.set()
    thread.join()
    assert zipfile.ZipFile(io.BytesIO(saved["user"])).testzip() is None
    no_crc = zipfile.ZipFile(io.BytesIO(saved["checkpoint"])).testzip() is not None
    assert no_crc == _per_thread_config()
    for blob in saved.values():
        assert torch.equal(torch.load(io.BytesIO(blob)), torch.arange(1000.0))
