"""What a resume of a 16-node × 8-rank FSDP checkpoint reads, against the ideal and today's pull.

    .venv/bin/python bench/_scale_resume.py [--nodes 16] [--ranks 8] [--gb 2] [--reshard-nodes 12]

A checkpoint of `--gb` GB (fp32 tensors sharded row-wise over nodes × ranks, as FSDP2 shards
them) is saved by DCP with mncloud's hashing writer (shards, chunk sidecars, manifest, COMPLETE)
into a SeaweedFS bucket on 127.0.0.1 behind a byte-counting proxy (`tests/servers.py`). The
ranks are threads of this process on torch's threaded process group (128 processes importing
torch would need ~32 GB here): the same DCP planning, the same `Resume`/`BucketReader` code and
exchange rounds a run uses, on a machine that cannot hold 128 torch processes. Arms, each with
the bytes the server served (counted at the proxy) and the wall time:

- **mncloud**: every rank's `Resume.load` of the step (the real read path), on the same world;
- **ideal**: every rank reads exactly its items' bytes with raw ranged GETs (no checks, no
  DCP), as many in flight per rank as mncloud;
- **today** (before #57): each rank pulled every shard file into its own folder, then DCP read
  it there. Run for one node's ranks and scaled to the world (bytes × nodes exactly; time as
  the server's throughput in that arm would serve them), since 128 × the checkpoint would not
  fit this disk;
- **resharded**: the step resumed on `--reshard-nodes` × ranks (each new shard straddles saved
  ones): bytes served and the bytes ranks exchanged among themselves.

Every resumed tensor is compared with what was saved. Printed as a table; `figures()` returns
them for `bench/scale.py`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402
from torch.testing._internal.distributed.multi_threaded_pg import (  # noqa: E402
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)

from mncloud.storage import CheckpointStore, Manifest  # noqa: E402
from mncloud.storage.chunks import CHUNKS_KEY, manifest_extra  # noqa: E402
from mncloud.train.resume import Resume  # noqa: E402
from mncloud.train.staging import hashing_filesystem  # noqa: E402
from mncloud.train.state import rng_state  # noqa: E402
from tests.servers import ByteCountingProxy, S3Server, free_port  # noqa: E402

TENSORS = 24
COLS = 2048
STEP = 100


class ThreadRanks:
    """What `Resume` asks of the checkpoint's groups, on the threaded world's default group."""

    def __init__(self) -> None:
        self.distributed = True
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.dcp_pg = dist.group.WORLD
        self.agree_pg = dist.group.WORLD

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def _rows(nbytes: int) -> int:
    return max(1, nbytes // (TENSORS * COLS * 4))


def _mine(rows: int) -> torch.Tensor:
    """The global rows this rank holds (FSDP2's even chunks; none past the last chunk)."""
    chunks = torch.arange(rows).chunk(dist.get_world_size())
    return chunks[dist.get_rank()] if dist.get_rank() < len(chunks) else torch.arange(0)


def _values(i: int, mine: torch.Tensor) -> torch.Tensor:
    """Tensor i's rows `mine`: each row holds i × 1e5 + its global index (exact in fp32)."""
    return (i * 1e5 + mine[:, None].float()).expand(len(mine), COLS).contiguous()


def _state(rows: int, zero: bool) -> dict[str, Any]:
    """This rank's shard of every tensor (`_values`), or zeros of its shape."""
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    mine = _mine(rows)
    state = {}
    for i in range(TENSORS):
        local = torch.zeros(len(mine), COLS) if zero else _values(i, mine)
        state[f"w{i}"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                            shape=(rows, COLS), stride=(COLS, 1))  # fmt: skip
    return state


def _threads(world: int, fn: Any) -> list[Any]:
    """Run `fn()` on `world` threads, each a rank of a threaded process group; their results."""
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        dist.init_process_group("threaded", rank=r, world_size=world, store=store)
        try:
            results[r] = fn()
        except BaseException as err:  # every thread is woken and ends
            errors.append(err)
            ProcessLocalGroup.exception_handle(err)
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _uninstall_threaded_pg()
    torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        raise errors[0]
    return results


def save(store: CheckpointStore, world: int, rows: int, work: Path) -> Manifest:
    """The step as a run of `world` ranks saves it (the folder path: shards, sidecars)."""
    folder = work / "save"

    def one() -> None:
        writer = dcp.FileSystemWriter(str(folder), sync_files=False)
        writer.fs = hashing_filesystem()
        dcp.save(_state(rows, zero=False), storage_writer=writer)
        extras = {"__rng__": ("value", rng_state())}  # what `split_state` records
        torch.save(extras, folder / f"rank_{dist.get_rank()}.pt")

    _threads(world, one)
    files = {p.name: p for p in folder.iterdir()}
    entries = store.upload(STEP, files, workers=16)
    manifest = Manifest(step=STEP, world_size=world, files=entries,
                        extra={CHUNKS_KEY: manifest_extra()})  # fmt: skip
    store.commit(manifest)
    shutil.rmtree(folder)
    return manifest


def _resume(store: CheckpointStore, world: int, rows: int, work: Path) -> dict[str, float]:
    """Every rank's real `Resume.load`, each tensor checked: the bytes ranks exchanged, and
    the slowest rank's seconds in all, fetching (its ranged reads) and loading (DCP's
    deserializing and copying, the exchange rounds)."""

    def one() -> dict[str, float]:
        state = _state(rows, zero=True)
        resume = Resume(store, ThreadRanks(), verify_sha256=False, spill_dir=work)
        t0 = time.perf_counter()
        assert resume.load(state, None) == STEP
        took = time.perf_counter() - t0
        for i in range(TENSORS):
            assert torch.equal(state[f"w{i}"].to_local(), _values(i, _mine(rows))), f"w{i}"
        return {**resume.stats, "total_s": took}

    per_rank = _threads(world, one)
    out = {k: max(r[k] for r in per_rank) for k in ("total_s", "fetch_s", "load_s")}
    out["exchanged_bytes"] = sum(r["received_bytes"] for r in per_rank)
    return out


def _ideal(store: CheckpointStore, manifest: Manifest, workers: int) -> None:
    """Each shard file read once with raw ranged GETs (what each rank's share adds up to)."""
    bucket = store.bucket
    jobs = []
    for name, entry in manifest.files.items():
        if name.endswith(".distcp"):
            for at in range(0, entry.size, 8 * 2**20):
                jobs.append((store.key(STEP, name), at, min(8 * 2**20, entry.size - at)))
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda j: bucket.get_range(*j), jobs))


def _today(store: CheckpointStore, manifest: Manifest, ranks: int, work: Path) -> None:
    """One node's ranks as before #57: each pulls every shard file into its own folder."""
    shared = [n for n in manifest.files if not n.startswith("rank_") and ".chunks" not in n]

    def one(rank: int) -> None:
        local = work / f"pull_{rank}"
        store.pull(STEP, local, names=[*shared, f"rank_{rank}.pt"], content=False)
        shutil.rmtree(local)

    with ThreadPoolExecutor(ranks) as pool:
        list(pool.map(one, range(ranks)))


def _timed(proxy: ByteCountingProxy, fn: Any) -> tuple[float, int]:
    """Seconds `fn()` took and the bytes the server served meanwhile."""
    proxy.reset()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, proxy.served


def figures(
    nodes: int = 16, ranks: int = 8, gb: float = 2.0, reshard_nodes: int = 12
) -> dict[str, float]:
    """The arms' bytes served and wall times (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="mncloud-scale-"))
    server = S3Server("seaweedfs", free_port(), work / "s3", volume_mb=1024)
    server.start()
    try:
        with ByteCountingProxy(server.port) as proxy:
            import os

            os.environ.update({**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
            store = CheckpointStore(f"s3://{server.make_bucket()}/scale")
            world = nodes * ranks
            rows = _rows(int(gb * 1e9))
            manifest = save(store, world, rows, work)
            size = manifest.total_size
            os.environ["LOCAL_WORLD_SIZE"] = str(ranks)
            out: dict[str, float] = {"world": world, "checkpoint_bytes": size}
            phases: list[dict[str, float]] = []
            out["mncloud_s"], out["mncloud_bytes"] = _timed(
                proxy, lambda: phases.append(_resume(store, world, rows, work))
            )
            out.update({f"mncloud_{k}": v for k, v in phases[0].items()})
            out["ideal_s"], out["ideal_bytes"] = _timed(
                proxy, lambda: _ideal(store, manifest, 8 * world)
            )
            t, b = _timed(proxy, lambda: _today(store, manifest, ranks, work))
            out["today_bytes"] = b * nodes
            out["today_s"] = t * nodes  # the same server serving every node's pull in turn
            new_world = reshard_nodes * ranks
            out["reshard_world"] = new_world
            out["reshard_s"], out["reshard_bytes"] = _timed(
                proxy, lambda: phases.append(_resume(store, new_world, rows, work))
            )
            out.update({f"reshard_{k}": v for k, v in phases[1].items()})
            return out
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(f: dict[str, float]) -> str:
    size = f["checkpoint_bytes"]
    lines = [f"resume of a {size / 1e9:.2f} GB FSDP checkpoint saved by {f['world']:.0f} ranks:",
             f"{'arm':<34}{'served':>12}{'× ckpt':>9}{'wall s':>9}"]  # fmt: skip
    arms = (("mncloud", "mncloud (each item once)"), ("ideal", "ideal (each rank its share)"),
            ("today", "today (every rank every shard)"),
            ("reshard", f"mncloud, resumed on {f['reshard_world']:.0f} ranks"))  # fmt: skip
    for arm, label in arms:
        b, s = f[f"{arm}_bytes"], f[f"{arm}_s"]
        lines.append(f"{label:<34}{b / 1e9:>10.2f}GB{b / size:>8.3f}×{s:>9.1f}")
    for arm in ("mncloud", "reshard"):
        lines.append(f"{arm}: slowest rank {f[arm + '_total_s']:.1f}s (fetching "
                     f"{f[arm + '_fetch_s']:.1f}s, loading {f[arm + '_load_s']:.1f}s); ranks "
                     f"exchanged {f[arm + '_exchanged_bytes'] / 1e9:.2f} GB")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--reshard-nodes", type=int, default=12)
    a = p.parse_args()
    print(report(figures(a.nodes, a.ranks, a.gb, a.reshard_nodes)))


if __name__ == "__main__":
    main()
