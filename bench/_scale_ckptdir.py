"""`--ckpt-dir` at users' sizes (#57), against SeaweedFS (`tests/servers.py`), one process.

1. **What a restore fetches.** A `--ckpt-dir` with `--units` committed Trainer-shaped
   `checkpoint-N/` (`--unit-mb` each: a few hundred MB in all) and a `snapshot.pt`, restored
   onto a fresh node folder: the bytes the server served, counted by
   `tests/servers.ByteCountingProxy` in front of it (in a process of its own, so its threads
   take nothing from the reader's), and the wall time. Before: every committed unit, one file
   after another, each then hashed (the restore until #57, kept here as `restore_before`).
   After: `NodeSync.restore` (the newest, ranges in parallel, hashed in passing).
2. **At the storage's speed.** One `--gb` unit (4 large files and a small one): its restore
   (`NodeSync.restore`) and its upload (`NodeSync.sync(final=True)`: every file streamed,
   then the marker) against boto3's transfer manager (s3transfer) copying the same files,
   all submitted at once, at concurrency 4 / 8 / 16 / 32 with 16 MiB parts and 8 / 16 with
   8 MiB: the best of those, in each direction, is the baseline. Then `--repeats` rounds of
   raw, ours, raw: each of ours against the mean of the raw runs around it (a drift in the
   machine's load hits both); the median ratio is reported (goal ≥ 0.9), and the CPU each
   side took in this process per GB (less at the mercy of the machine's load than time).

The server keeps its data in memory (/dev/shm) when there is room, else on disk; its volumes
hold 1024 MB and are vacuumed after each upload (outside the timed part), so overwritten
uploads do not pile up. The node folders are on /tmp.

    .venv/bin/python bench/_scale_ckptdir.py [--units 10] [--unit-mb 30] [--gb 2] [--repeats 3]

`figures()` returns the numbers (for `bench/scale.py`); run alone, it prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mncloud.storage import folders, open_bucket  # noqa: E402
from mncloud.storage.buckets import Bucket  # noqa: E402
from mncloud.storage.foldersync import NodeSync  # noqa: E402
from tests.servers import S3Server, free_port  # noqa: E402

MB, MiB = 10**6, 2**20
RAW_CONFIGS = [(4, 16), (8, 16), (16, 16), (32, 16), (8, 8), (16, 8)]
"""boto3 transfer manager (max_concurrency, part MiB) tried for the baseline."""
PROXY = """
import sys
from tests.servers import ByteCountingProxy
proxy = ByteCountingProxy(int(sys.argv[1]))
print(proxy.port, flush=True)
for line in sys.stdin:
    if line.strip() == "reset":
        proxy.reset()
    print(proxy.served, flush=True)
"""


class ProxyProcess:
    """`ByteCountingProxy` in a process of its own: `served()` after `reset()`."""

    def __init__(self, port: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PROXY, str(port)], cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self._proc.stdout is not None
        self.endpoint = f"http://127.0.0.1:{int(self._proc.stdout.readline())}"

    def _ask(self, what: str) -> int:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(what + "\n")
        self._proc.stdin.flush()
        return int(self._proc.stdout.readline())

    def reset(self) -> None:
        self._ask("reset")

    def served(self) -> int:
        return self._ask("count")

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()


def restore_before(bucket: Bucket, prefix: str, root: Path) -> None:
    """The restore until #57 (`NodeFolder.restore`): every committed unit, file by file."""
    root.mkdir(parents=True)
    for v in folders.judge(bucket, prefix):
        if v.committed and not v.folder:
            bucket.get_file(f"{prefix}/{v.name}", root / v.name)
        elif v.committed:
            for rel, (size, hashes) in sorted(v.files.items()):
                target = root / v.name / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                bucket.get_file(f"{prefix}/{v.name}/{rel}", target)
                assert folders.hash_file(target) in hashes and target.stat().st_size == size


def _block(mb: float) -> bytes:
    return os.urandom(min(int(mb * MB), 64 * MiB))


def write_unit(folder: Path, files: dict[str, float]) -> None:
    """A checkpoint folder: each file `mb` MB of random bytes (a 64 MiB block repeated)."""
    folder.mkdir(parents=True)
    for name, mb in files.items():
        block, left = _block(mb), int(mb * MB)
        with open(folder / name, "wb") as f:
            while left > 0:
                f.write(block[:left])
                left -= len(block)


def node(path: Path, bucket: Bucket, prefix: str) -> NodeSync:
    return NodeSync(path, path.with_suffix(".up"), bucket, prefix, 0, 1, set)


def _server_root(gb: float) -> str | None:
    """Memory (/dev/shm) for the server's data when it has room for 4 copies of the unit and
    8 GB to spare (neither side then waits on the disk's writeback), else the temp dir."""
    import psutil

    need = 4 * gb * 1e9 + 8e9
    shm = Path("/dev/shm")
    try:
        roomy = shutil.disk_usage(shm).free >= need and psutil.virtual_memory().available >= need
    except OSError:
        roomy = False
    return str(shm) if roomy else None


def vacuum(server: S3Server) -> None:
    """Ask SeaweedFS to reclaim what overwritten uploads left in its volumes (best effort)."""
    import urllib.request

    port = server._ports.get("master")
    with contextlib.suppress(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/vol/vacuum?garbageThreshold=0.01",
                               timeout=120).read()  # fmt: skip


CPU: list[float] = []
"""Core-seconds of this process (every thread) each `_timed` call took, in order."""


def _timed(fn: Callable[[], object]) -> float:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    CPU.append(time.process_time() - c0)
    return time.perf_counter() - t0


def units_figures(server: S3Server, work: Path, units: int, unit_mb: float) -> dict[str, float]:
    """Part 1: bytes served and time of a restore of `units` committed folders."""
    bucket, prefix = open_bucket(f"s3://{server.make_bucket()}/run/ckpt-dir", retry_seconds=30)
    writer = node(work / "writer", bucket, prefix)
    writer.restore()
    for i in range(1, units + 1):
        write_unit(writer.path / f"checkpoint-{10 * i}", {
            "model.safetensors": unit_mb / 3, "optimizer.pt": unit_mb * 2 / 3,
            "scheduler.pt": 0.001, "trainer_state.json": 0.001, "rng_state_0.pth": 0.01,
        })  # fmt: skip
        writer.sync(final=True)
    (writer.path / "snapshot.pt").write_bytes(b"s" * 1000)
    writer.sync(final=True)
    shutil.rmtree(writer.path)
    proxy = ProxyProcess(server.port)
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
    out: dict[str, float] = {"ckptdir_units": units, "ckptdir_units_mb": units * unit_mb}
    try:
        via, _ = open_bucket(f"s3://{bucket.name}", retry_seconds=30)  # type: ignore[attr-defined]
        for arm, restore in (
            ("before", lambda: restore_before(via, prefix, work / "before")),
            ("after", lambda: node(work / "after", via, prefix).restore()),
        ):
            proxy.reset()
            out[f"ckptdir_restore_s_{arm}"] = _timed(restore)
            out[f"ckptdir_restore_mb_{arm}"] = proxy.served() / MB
    finally:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        proxy.close()
    out["ckptdir_restore_bytes_ratio"] = (
        out["ckptdir_restore_mb_after"] / out["ckptdir_restore_mb_before"]
    )
    return out


class Raw:
    """boto3's transfer manager copying a folder's files, all submitted at once."""

    def __init__(self, server: S3Server, bucket: str, src: Path) -> None:
        self.client, self.bucket, self.src = server.client(), bucket, src
        self.files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())

    def _manager(self, conc: int, part_mib: int) -> Any:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(max_concurrency=conc, multipart_chunksize=part_mib * MiB,
                                multipart_threshold=part_mib * MiB)  # fmt: skip
        return create_transfer_manager(self.client, config)

    def upload(self, conc: int, part_mib: int) -> float:
        def run() -> None:
            with self._manager(conc, part_mib) as tm:
                futures = [
                    tm.upload(str(self.src / f), self.bucket, f"raw/{f}") for f in self.files
                ]
                for future in futures:
                    future.result()

        return _timed(run)

    def download(self, conc: int, part_mib: int, dest: Path) -> float:
        def run() -> None:
            with self._manager(conc, part_mib) as tm:
                futures = []
                for f in self.files:
                    (dest / f).parent.mkdir(parents=True, exist_ok=True)
                    futures.append(tm.download(self.bucket, f"raw/{f}", str(dest / f)))
                for future in futures:
                    future.result()

        took = _timed(run)
        shutil.rmtree(dest)
        return took


def _ratios(name: str, times: dict[str, list[float]], size: int, prefix: str) -> dict[str, float]:
    """Each of our runs against the mean of the raw runs around it: median, min, max; and the
    raw copy's speed."""
    raw, ours = times[f"{name}_raw"], times[name]
    ratios = [(raw[2 * i] + raw[2 * i + 1]) / 2 / t for i, t in enumerate(ours)]
    what = {"up": "upload", "down": "restore"}[name]
    return {
        f"{prefix}_{what}_vs_raw": statistics.median(ratios),
        f"{prefix}_{what}_vs_raw_min": min(ratios),
        f"{prefix}_{what}_vs_raw_max": max(ratios),
        f"{prefix}_{what}_raw_mb_s": size / MB / statistics.median(raw),
    }


def race(
    server: S3Server,
    raw: Raw,
    ours: dict[str, Callable[[], float]],
    *,
    scratch: Path,
    repeats: int,
    size: int,
    prefix: str,
) -> dict[str, float]:
    """Our upload and restore (`ours["up"]`, `ours["down"]`: each returns its `_timed`
    seconds) against the transfer manager's best copy of the same bytes (`raw`), in rounds of
    raw, ours, raw; figures named `<prefix>_…`."""

    def upload_raw(conc: int, part: int) -> float:
        took = raw.upload(conc, part)
        vacuum(server)  # what the upload overwrote, reclaimed outside the timed part
        return took

    best_up = min(RAW_CONFIGS, key=lambda c: upload_raw(*c))
    best_down = min(RAW_CONFIGS, key=lambda c: raw.download(*c, scratch))
    arms: dict[str, Callable[[], float]] = {
        "up_raw": lambda: upload_raw(*best_up),
        "up": ours["up"],
        "down_raw": lambda: raw.download(*best_down, scratch),
        "down": ours["down"],
    }  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(repeats):  # raw, ours, raw: a drift of the machine's load hits both
        for arm in ("up_raw", "up", "up_raw", "down_raw", "down", "down_raw"):
            times[arm].append(arms[arm]())
            cpu[arm].append(CPU[-1])
    return {
        **{
            f"{prefix}_{k}_cpu_s_per_gb": statistics.median(v) / (size / 1e9)
            for k, v in cpu.items()
        },
        **_ratios("up", times, size, prefix),
        **_ratios("down", times, size, prefix),
        f"{prefix}_raw_upload_concurrency": best_up[0],
        f"{prefix}_raw_upload_part_mib": best_up[1],
        f"{prefix}_raw_restore_concurrency": best_down[0],
        f"{prefix}_raw_restore_part_mib": best_down[1],
    }


def speed_figures(server: S3Server, work: Path, gb: float, repeats: int) -> dict[str, float]:
    """Part 2: one `gb` unit's restore and upload against the transfer manager's best."""
    name = server.make_bucket()
    bucket, prefix = open_bucket(f"s3://{name}/run/ckpt-dir", retry_seconds=60)
    src = work / "src"
    mb = gb * 1000
    write_unit(src / "checkpoint-100", {
        "model-00001.safetensors": 0.3 * mb, "model-00002.safetensors": 0.3 * mb,
        "optimizer.pt": 0.3 * mb, "optimizer-extra.pt": 0.1 * mb, "trainer_state.json": 0.001,
    })  # fmt: skip
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())

    def upload_ours() -> float:
        took = _timed(lambda: node(src, bucket, prefix).sync(final=True))
        vacuum(server)
        return took

    def restore_ours() -> float:
        fresh = node(work / "restored", bucket, prefix)
        took = _timed(fresh.restore)
        shutil.rmtree(fresh.path)
        return took

    ours = {"up": upload_ours, "down": restore_ours}
    return {
        "ckptdir_unit_gb": size / 1e9,
        **race(
            server,
            Raw(server, name, src),
            ours,
            scratch=work / "raw",
            repeats=repeats,
            size=size,
            prefix="ckptdir",
        ),
    }


@contextlib.contextmanager
def seaweed(gb: float, prefix: str) -> Iterator[tuple[S3Server, Path]]:
    """A SeaweedFS server on a disk with room for `gb` (its env in os.environ meanwhile) and a
    scratch folder; both gone afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    data = Path(tempfile.mkdtemp(prefix="mncloud-scale-s3-", dir=_server_root(gb)))
    server = S3Server("seaweedfs", free_port(), data / "s3", volume_mb=1024)
    try:
        server.start()
        with mock.patch.dict(os.environ, server.env()):
            yield server, work
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def figures(
    units: int = 10, unit_mb: float = 30, gb: float = 2, repeats: int = 3
) -> dict[str, float]:
    """Every figure of this bench (see the module docstring)."""
    with seaweed(gb, "mncloud-scale-ckptdir-") as (server, work):
        out = units_figures(server, work / "units", units, unit_mb)
        out.update(speed_figures(server, work / "speed", gb, repeats))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=10)
    ap.add_argument("--unit-mb", type=float, default=30)
    ap.add_argument("--gb", type=float, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for key, value in figures(args.units, args.unit_mb, args.gb, args.repeats).items():
        print(f"{key:34} {value:10.2f}")


if __name__ == "__main__":
    main()
