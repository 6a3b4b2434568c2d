"""A resume reads only what its ranks load: the chunk hashes written at save, the verified
ranged reads (real S3, GCS and folder buckets), and who fetches which item (each once)."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from mncloud.constants import REFUSED_MARKER_ENV
from mncloud.storage import CheckpointStore, Manifest
from mncloud.storage.checkpoints import FileEntry
from mncloud.storage.chunks import CHUNK_SIZE, CHUNKS_KEY, ChunkDigests, FileHasher
from mncloud.storage.chunks import manifest_extra as chunks_extra
from mncloud.storage.rangeread import RangeRefused, StepFiles
from mncloud.train import CheckpointManager
from mncloud.train.fetchplan import Share, assign
from tests.servers import ByteCountingProxy

# --------------------------------------------------------------------------- chunk hashes


def test_the_sidecar_holds_each_chunk_s_digest_whatever_the_writes() -> None:
    data = os.urandom(3 * CHUNK_SIZE + 1234)
    hasher = FileHasher(chunks=True)
    for at in range(0, len(data), 50_000):  # writes that straddle chunk boundaries
        hasher.update(data[at : at + 50_000])
    want = b"".join(
        xxhash.xxh3_128_digest(data[at : at + CHUNK_SIZE]) for at in range(0, len(data), CHUNK_SIZE)
    )
    assert hasher.sidecar() == want
    assert hasher.hexdigest() == xxhash.xxh3_128_hexdigest(data)
    assert FileHasher(chunks=False).sidecar() == b""

    digests = ChunkDigests("__0_0.distcp", len(data), want)
    assert digests.problem() is None
    assert digests.span(CHUNK_SIZE + 5, CHUNK_SIZE + 9) == (CHUNK_SIZE, 2 * CHUNK_SIZE)
    assert digests.span(3 * CHUNK_SIZE + 1, len(data)) == (3 * CHUNK_SIZE, len(data))
    assert digests.check(CHUNK_SIZE, data[CHUNK_SIZE:]) is None
    bad = bytearray(data)
    bad[2 * CHUNK_SIZE + 7] ^= 1
    lo = 2 * CHUNK_SIZE
    assert digests.check(CHUNK_SIZE, bad[CHUNK_SIZE:]) == (
        f"__0_0.distcp bytes {lo}-{lo + CHUNK_SIZE - 1} fail their xxh3_128"
    )
    assert "holds" in str(ChunkDigests("x", len(data), want[:-16]).problem())


# --------------------------------------------------------------------------- ranged reads


def _step_with_a_shard(uri: str, tmp_path: Path, data: bytes) -> CheckpointStore:
    """A committed step 1 whose only shard is `data`, with its sidecar, as a save writes it."""
    hasher = FileHasher(chunks=True)
    hasher.update(data)
    (tmp_path / "__0_0.distcp").write_bytes(data)
    (tmp_path / "__0_0.distcp.chunks").write_bytes(hasher.sidecar())
    store = CheckpointStore(uri)
    files = {n: tmp_path / n for n in ("__0_0.distcp", "__0_0.distcp.chunks")}
    entries = store.upload(1, files)
    store.commit(Manifest(step=1, world_size=1, files=entries, extra={CHUNKS_KEY: chunks_extra()}))
    return store


def test_ranged_reads_fetch_only_the_chunks_they_touch(bucket_uri: str, tmp_path: Path) -> None:
    data = os.urandom(40 * CHUNK_SIZE + 99)
    store = _step_with_a_shard(bucket_uri, tmp_path, data)
    files = StepFiles(store, store.read_manifest(1), piece_bytes=3 * CHUNK_SIZE)
    wanted = [("__0_0.distcp", 10, 20), ("__0_0.distcp", 5 * CHUNK_SIZE + 3, 9 * CHUNK_SIZE),
              ("__0_0.distcp", 9 * CHUNK_SIZE, 9 * CHUNK_SIZE + 1),
              ("__0_0.distcp", len(data) - 50, len(data))]  # fmt: skip
    got = files.read(wanted)
    for rng in wanted:
        assert bytes(got[rng]) == data[rng[1] : rng[2]]
    sidecar = 41 * 16
    # chunk 0, chunks 5-9 (one run: the ranges touch), the last partial chunk
    assert files.fetched_bytes == sidecar + CHUNK_SIZE + 5 * CHUNK_SIZE + 99


@pytest.mark.parametrize("fault", ["flipped", "truncated", "missing"])
def test_a_range_that_cannot_be_read_whole_refuses_the_step(
    bucket_uri: str, tmp_path: Path, fault: str
) -> None:
    data = os.urandom(8 * CHUNK_SIZE)
    store = _step_with_a_shard(bucket_uri, tmp_path, data)
    manifest = store.read_manifest(1)
    key = store.key(1, "__0_0.distcp")
    if fault == "flipped":
        bad = bytearray(data)
        bad[6 * CHUNK_SIZE] ^= 0x80
        store.bucket.put_bytes(key, bytes(bad))
        why = rf"__0_0.distcp bytes {6 * CHUNK_SIZE}-{7 * CHUNK_SIZE - 1} fail their xxh3_128"
    elif fault == "truncated":
        store.bucket.put_bytes(key, data[: 7 * CHUNK_SIZE])
        why = r"__0_0.distcp bytes \d+-\d+: .*returned"
    else:
        store.bucket.delete(key)
        why = r"__0_0.distcp bytes \d+-\d+: .*does not exist"
    with pytest.raises(RangeRefused, match=why):
        StepFiles(store, manifest).read([("__0_0.distcp", 0, len(data))])
    # A range the fault does not touch still reads (and verifies) where the object exists.
    if fault == "flipped":
        head = StepFiles(store, manifest).read([("__0_0.distcp", 0, 100)])
        assert bytes(next(iter(head.values()))) == data[:100]


def test_a_bucket_that_does_not_answer_is_not_a_bad_step(tmp_path: Path) -> None:
    """An outage (here `chaos storage-outage`'s, on a folder bucket) outlasting the retries is
    the bucket's `StorageError`, not `RangeRefused`: a resume then fails and is retried,
    instead of taking an older step (or none) for a torn one."""
    from mncloud.errors import StorageError
    from mncloud.storage import set_simulated_outage

    root = tmp_path / "bucket"
    store = _step_with_a_shard(f"file://{root}", tmp_path, os.urandom(3 * CHUNK_SIZE))
    manifest = store.read_manifest(1)
    store.bucket.retry_seconds = 0.3
    set_simulated_outage(f"file://{root}", True)
    with pytest.raises(StorageError) as err:
        StepFiles(store, manifest).read([("__0_0.distcp", 0, 10)])
    assert not isinstance(err.value, RangeRefused) and "unavailable" in str(err.value)


def test_a_step_without_sidecars_reads_ranges_checked_by_size(tmp_path: Path) -> None:
    """Saved before chunk hashes: ranges by size; `whole_files` checks each whole file."""
    data = os.urandom(3 * CHUNK_SIZE)
    (tmp_path / "__0_0.distcp").write_bytes(data)
    store = CheckpointStore(f"file://{tmp_path / 'b'}")
    entries = store.upload(1, {"__0_0.distcp": tmp_path / "__0_0.distcp"})
    store.commit(Manifest(step=1, world_size=1, files=entries))
    manifest = store.read_manifest(1)
    plain = StepFiles(store, manifest)
    assert bytes(plain.read([("__0_0.distcp", 7, 70)])[("__0_0.distcp", 7, 70)]) == data[7:70]
    assert plain.fetched_bytes == 63
    whole = StepFiles(store, manifest, whole_files=True)
    whole.read([("__0_0.distcp", 7, 70)])
    assert whole.fetched_bytes == len(data)
    bad = bytearray(data)
    bad[-1] ^= 1
    store.bucket.put_bytes(store.key(1, "__0_0.distcp"), bytes(bad))
    with pytest.raises(RangeRefused, match="xxh3_128 differs"):
        StepFiles(store, manifest, whole_files=True).read([("__0_0.distcp", 7, 70)])
    assert isinstance(manifest.files["__0_0.distcp"], FileEntry)


# --------------------------------------------------------------------------- who fetches what


def _fetched(shares: list[Share]) -> list[tuple[str, int, int]]:
    return sorted(item for share in shares for item in share.fetch)


def test_the_same_world_fetches_its_own_shard_and_exchanges_nothing() -> None:
    needs = [[("__0_0.distcp", 0, 100), ("__0_0.distcp", 100, 300)], [("__1_0.distcp", 0, 300)]]
    shares = assign(needs)
    assert [s.fetch for s in shares] == needs
    assert all(not s.rounds for s in shares)


def test_a_resharded_load_fetches_each_item_once_and_hands_it_on() -> None:
    a, c, d = ("__0_0.distcp", 0, 50), ("__1_0.distcp", 0, 50), ("__1_0.distcp", 50, 90)
    shares = assign([[a], [a, c], [c, d]])
    assert _fetched(shares) == sorted([a, c, d])  # once each
    assert [len(s.rounds) for s in shares] == [1, 1, 1]
    for src, share in enumerate(shares):
        for dst, items in share.rounds[0].send.items():
            assert shares[dst].rounds[0].recv[src] == items
            assert all(item in share.fetch for item in items)
    received = {item for s in shares for items in s.rounds[0].recv.values() for item in items}
    needs = {0: {a}, 1: {a, c}, 2: {c, d}}
    for rank, share in enumerate(shares):
        got = set(share.fetch) | {i for items in share.rounds[0].recv.values() for i in items}
        assert needs[rank] <= got
    assert received <= {a, c}


def test_replicated_items_spread_over_the_ranks_and_rounds_stay_bounded() -> None:
    """DDP: every rank needs every item; the fetches spread, each item leaves the bucket
    once, and no rank receives more than a round's budget at once."""
    items = [("__0_0.distcp", i * 100, i * 100 + 100) for i in range(8)]
    shares = assign([items] * 4, round_bytes=250)
    assert _fetched(shares) == items
    assert sorted(s.fetch_bytes for s in shares) == [200, 200, 200, 200]
    rounds = len(shares[0].rounds)
    assert rounds > 1 and all(len(s.rounds) == rounds for s in shares)
    for share in shares:
        for rnd in share.rounds:
            assert sum(e - s for v in rnd.recv.values() for _, s, e in v) <= 250
        got = set(share.fetch) | {i for r in share.rounds for v in r.recv.values() for i in v}
        assert got == set(items)


# --------------------------------------------------------------------------- at size, end to end

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_fsdp.py"
FLAGS = ["--gpus", "cpu:2", "--recovery-delay", "0.5s"]
BIG = ["--dim", "640", "--layers", "7", "--seq-len", "8", "--global-batch", "12",
       "--micro-batch", "1", "--samples", "96", "--ckpt-interval", "2"]  # fmt: skip
"""A 34.4 M-parameter model: with AdamW's two moments, a 417 MB checkpoint (fp32), on CPU."""


def _resumed_step(log: str) -> int:
    """The step the (last) relaunch resumed from, as the run's log says."""
    found = re.findall(r"resumed from checkpoint step (\d+)", log)
    assert found, log[-3000:]
    return int(found[-1])


@pytest.mark.slow
@pytest.mark.catalog
def test_a_preempted_fsdp_run_reads_its_checkpoint_once(
    s3_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 nodes × 2 ranks, a 417 MB checkpoint, node 1 preempted: between the preemption and
    the end the S3 server serves ≤ 1.25 × the resumed step's bytes (counted by a proxy in
    front of it; every rank pulled every shard before: 4×), and the run ends on the
    uninterrupted run's weights."""
    from mncloud.backends.base import RunState
    from mncloud.backends.local.figures import read_final
    from tests.reference import reference_final
    from tests.test_local import cli, run_log, steps_since, up, wait_final, wait_until

    args = [*BIG, "--steps", "4"]
    bucket = s3_env.make_bucket()
    with ByteCountingProxy(s3_env.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        up("bigread", EXAMPLE, "--nodes", "2", *FLAGS, "--bucket", f"s3://{bucket}/x",
           script_args=args)  # fmt: skip
        store = CheckpointStore(f"s3://{bucket}/x/bigread")

        def checkpoint_behind_training() -> bool:
            good, _ = store.candidates()
            return bool(good) and max(steps_since("bigread", 0), default=0) > good[0]

        wait_until(checkpoint_behind_training, 400, "a checkpoint, and a step past it")
        proxy.reset()
        cli("chaos", "preempt", "bigread", "--node", "1")
        state = wait_final("bigread", timeout=600)
        served = proxy.served
        assert state.state is RunState.SUCCEEDED, run_log("bigread")
        assert _resumed_step(run_log("bigread")) >= 2
        resumed = store.read_manifest(4)  # the resumed step may be gone (keep-last-K): same size
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.endpoint)
    assert state.preemptions == 1
    assert resumed.total_size >= 400e6 and resumed.world_size == 4
    assert served <= 1.25 * resumed.total_size, (served, resumed.total_size)
    final = read_final(state.ckpt_uri)
    reference = reference_final(EXAMPLE, ["--nodes", "2", *FLAGS], args)
    assert final is not None and final["weights_sha256"] == reference["weights_sha256"]


@pytest.mark.slow
@pytest.mark.catalog
def test_a_resume_on_three_times_the_nodes_reads_its_checkpoint_once(
    s3_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved on 1 node × 2 ranks, resumed with `--nodes 3` (6 ranks, each shard straddling
    the saved ones): the server serves ≤ 1.25 × the step's bytes for the resume, and the
    resharded state is the saved one bit for bit (the gathered weights' sha256)."""
    from mncloud.backends.base import RunState
    from mncloud.backends.local.figures import read_final
    from tests.test_local import run_log, up, wait_final

    bucket = s3_env.make_bucket()
    finals, served = [], []
    with ByteCountingProxy(s3_env.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        for nodes in (1, 3):
            resume = ["--resume"] if nodes == 3 else []
            proxy.reset()
            up("reshard", EXAMPLE, "--nodes", str(nodes), *FLAGS, *resume, "--bucket",
               f"s3://{bucket}/x", script_args=[*BIG, "--steps", "2"])  # fmt: skip
            leg = wait_final("reshard", timeout=600)
            assert leg.state is RunState.SUCCEEDED, run_log("reshard")
            served.append(proxy.served)
            finals.append(read_final(leg.ckpt_uri))
        step = CheckpointStore(f"s3://{bucket}/x/reshard").read_manifest(2)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.endpoint)
    assert "resumed from checkpoint step 2" in run_log("reshard")
    assert step.world_size == 2 and step.total_size >= 400e6
    assert served[1] <= 1.25 * step.total_size, (served, step.total_size)
    assert finals[0] is not None and finals[1] is not None
    assert finals[1]["world_size"] == 6 and finals[1]["steps"] == 2
    assert finals[1]["weights_sha256"] == finals[0]["weights_sha256"]


# --------------------------------------------------------------------------- room for a share


def _saved_model(uri: str) -> tuple[torch.nn.Module, int]:
    """A 4 MB model saved at step 3; the model and the step's bytes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    with CheckpointManager(uri) as ckpt:
        assert ckpt.save(3, {"model": model}, wait=True)
    return model, CheckpointStore(uri).read_manifest(3).total_size


def _short_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's memory as a node with 1 MB free would report it (nothing else can
    shrink a host's memory for one test)."""
    from mncloud.train import reader

    real = reader.psutil.virtual_memory()
    monkeypatch.setattr(reader.psutil, "virtual_memory", lambda: real._replace(available=2**20))


def test_a_share_that_memory_cannot_hold_is_staged_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"file://{tmp_path / 'bucket'}"
    model, _ = _saved_model(uri)
    _short_memory(monkeypatch)
    fresh = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    with caplog.at_level(logging.INFO), CheckpointManager(uri, staging_dir=tmp_path / "st") as c:
        assert c.load({"model": fresh}) == 3
    assert "staged on disk at" in caplog.text
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_node_without_room_for_its_share_says_so_once_and_fetches_nothing(
    s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory and disk both short: one line with the sizes and the folder, exit code 2 (the
    refusal marker says so: nothing retries it), the state untouched, no shard fetched."""
    from mncloud.train import reader

    bucket = s3_env.make_bucket()
    _, size = _saved_model(f"s3://{bucket}/x")
    _short_memory(monkeypatch)
    real = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(reader.shutil, "disk_usage", lambda _p: real._replace(free=2**20))
    marker = tmp_path / "refused"
    monkeypatch.setenv(REFUSED_MARKER_ENV, str(marker))
    fresh = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    before = [p.detach().clone() for p in fresh.parameters()]
    with ByteCountingProxy(s3_env.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        ckpt = CheckpointManager(f"s3://{bucket}/x", staging_dir=tmp_path / "st")
        with pytest.raises(SystemExit) as refused:
            ckpt.load({"model": fresh})
        served = proxy.served
    assert refused.value.code == 2
    line = str(refused.value)
    assert re.fullmatch(r"resuming step 3 needs 0\.00 GB for each of this node's 1 rank\(s\): "
                        r"0\.00 GB of memory free and 0\.00 GB free at \S+/st/rank_0; free "
                        r"some, or resume on more nodes", line), line  # fmt: skip
    assert marker.read_text().strip() == line
    assert served < size / 4, (served, size)  # the manifest, DCP's metadata, the extras
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters(), strict=True))


# --------------------------------------------------------------------------- items in place


@pytest.mark.parametrize("shift", [0, 1, 3])
def test_a_saved_tensor_is_viewed_where_its_bytes_lie(shift: int) -> None:
    """What DCP wrote with `torch.save`, read without a copy: any dtype, a strided view, a
    scalar, an empty tensor, a Parameter, with or without the archive's CRCs (a checkpoint's
    have none), at any alignment in the fetched buffer; anything else is left to `torch.load`
    (None)."""
    from torch.utils.serialization import config

    from mncloud.train.itembytes import ViewFile, tensor_in_place

    def saved(obj: Any) -> memoryview:
        buf = io.BytesIO()
        with config.patch({"save.compute_crc32": shift != 0}):  # checkpoints save without
            torch.save(obj, buf)
        return memoryview(bytearray(shift) + bytearray(buf.getvalue()))[shift:]

    for tensor in (torch.randn(64, 33), torch.arange(10, dtype=torch.int64),
                   torch.ones(7, dtype=torch.bfloat16), torch.randn(6, 10).t(),
                   torch.tensor(3.5), torch.empty(0, 4),
                   torch.nn.Parameter(torch.randn(4, 5))):  # fmt: skip
        data = saved(tensor)
        view = tensor_in_place(data)
        assert isinstance(view, torch.Tensor) and view.dtype == tensor.dtype
        assert view.shape == tensor.shape and view.stride() == tensor.stride()
        assert torch.equal(view, tensor)
        if tensor.numel():  # a view of the fetched bytes, not a copy
            base = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
            assert base <= view.data_ptr() < base + len(data)
    for other in ({"a": torch.ones(2)}, [torch.ones(2), torch.ones(3)], 7):
        assert tensor_in_place(saved(other)) is None
        torch.load(ViewFile(saved(other)), weights_only=True)  # the fallback reads it
