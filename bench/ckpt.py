"""Checkpoint benchmark against a local S3 server (SeaweedFS, else moto).

1. Throughput: CheckpointManager save + upload + commit of a ~256 MB state, against a raw
   boto3 multipart upload of the same bytes to the same server, run by run: raw, checkpoint,
   raw, and the checkpoint is compared with the mean of the two raw uploads around it (so a
   drift in the machine's load or the server's speed hits both alike). Prints min/median/max
   of the ratio (raw time / checkpoint time), goals: median ≥ 0.95, min ≥ 0.85; and the same
   figures for raw before / raw after: the noise floor of the ratio on this machine.
   The raw upload sends the same tensors' bytes (a `torch.save` of the state dict) from memory,
   as the checkpoint does, with the same part size (16 MiB) and parts in flight (8).
   Also printed: the CPU each side takes per upload (this process: the client, every thread;
   and the server), since on a 2-core machine they share the cores.
   The server's volumes hold 1024 MB (`--volume-mb`; the tests' fixture keeps SeaweedFS's 64 MB
   so that many buckets fit): a 268 MB upload into 64 MB volumes fills one every 4 parts and
   waits while the master grows the next, at moments that differ from run to run, which alone
   moved raw ÷ raw between 0.70 and 1.35. Volumes larger than an upload grow once every few
   uploads instead of several times in each.
2. Where a save's time goes: staging copy (training thread), DCP write - streamed into the
   multipart uploads for S3, so uploads overlap it (xxh3_128 as the bytes pass, time waiting
   for a free part buffer) - the upload left after DCP finished, commit.
3. Stall: time the training thread spends in an async save vs a blocking one (goal ≤ 0.1),
   and the first async save after `load` vs later ones: `load` starts allocating the staging
   buffers in the background, so it is timed once they are there (an interval at least that
   long), and once right after `load` (no step between: it waits for the rest of them).

    .venv/bin/python bench/ckpt.py [--mb 256] [--repeats 5] [--folder] [--volume-mb 1024]
"""

from __future__ import annotations

import argparse
import collections
import io
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mncloud.train import CheckpointManager  # noqa: E402
from tests.servers import S3Server, free_port  # noqa: E402

PART = 16 * 1024 * 1024
PHASES = {
    "stage_s": "stage (copy to CPU buffers, training thread)",
    "write_s": "DCP write (when streamed, the uploads overlap it)",
    "hash_s": "  of it: xxh3_128 of the bytes as they pass",
    "buffer_wait_s": "  of it: waiting for a part buffer (upload-bound)",
    "upload_s": "upload after DCP finished",
    "commit_s": "commit (manifest + COMPLETE)",
}


def raw_multipart(client, bucket: str, key: str, data: bytes, workers: int = 8) -> float:
    """Upload `data` (already in memory, as the checkpoint's tensors are) with
    create_multipart_upload / upload_part / complete, `workers` parts at once; return seconds."""
    size = len(data)
    t0 = time.perf_counter()
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    def part(i: int) -> dict:
        body = data[i * PART : (i + 1) * PART]
        etag = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=i + 1, Body=body
        )["ETag"]
        return {"ETag": etag, "PartNumber": i + 1}

    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(part, range((size + PART - 1) // PART)))
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    return time.perf_counter() - t0


def _server_root(nbytes: int, repeats: int) -> str | None:
    """Where the server keeps its data: memory (/dev/shm) when it has room for every upload of
    the run with 4 GB to spare, so neither side meets the disk's writeback; else the temp dir."""
    import psutil

    need = 5 * repeats * nbytes + 4 * 2**30  # per repeat: 4 checkpoint saves + 1 raw upload
    shm = Path("/dev/shm")
    try:
        roomy = shutil.disk_usage(shm).free >= need and psutil.virtual_memory().available >= need
    except OSError:
        roomy = False
    return str(shm) if roomy else None


def _start_server(nbytes: int, repeats: int, volume_mb: int) -> tuple[S3Server, Path]:
    """SeaweedFS with `volume_mb` volumes (moto if it cannot start), its data in RAM when
    there is room."""
    work = Path(tempfile.mkdtemp(prefix="mncloud-bench-", dir=_server_root(nbytes, repeats)))
    server = S3Server("seaweedfs", free_port(), work / "s3", volume_mb=volume_mb)
    try:
        server.start()
    except (RuntimeError, FileNotFoundError):
        server = S3Server("moto", free_port(), work / "s3")
        server.start()
    return server, work


class _Cpu:
    """Core-seconds used by this process (the client: every thread) and by the server."""

    def __init__(self, server: S3Server) -> None:
        import psutil

        self._server = psutil.Process(server._proc.pid) if server._proc else None

    def now(self) -> tuple[float, float]:
        ours = time.process_time()
        if self._server is None:
            return ours, 0.0
        t = self._server.cpu_times()
        kids = sum(c.cpu_times().user + c.cpu_times().system for c in self._server.children())
        return ours, t.user + t.system + kids

    def since(self, before: tuple[float, float]) -> tuple[float, float]:
        now = self.now()
        return now[0] - before[0], now[1] - before[1]


def _one_run(r: int, fig: dict[str, list], state: dict, bucket: str, client, data: bytes,
             folder: bool, cpu: _Cpu) -> None:  # fmt: skip
    """One repeat: load + first save, raw / checkpoint / raw, then a blocking save."""
    ckpt = CheckpointManager(f"s3://{bucket}/async{r}", keep=2)
    ckpt._saving.stream_uploads = not folder
    t0 = time.perf_counter()
    ckpt.load(state)  # what a training script does first: starts allocating buffers
    fig["load_s"].append(time.perf_counter() - t0)
    ckpt._slots.wait_warm()  # the background allocation, done before the interval
    fig["warm_s"].append(time.perf_counter() - t0)
    ckpt.save(1, state)
    fig["first_stall"].append(ckpt.last_stall_s)
    ckpt.wait()
    if r == 0:  # the worst case: a save right after `load`, no step between
        now = CheckpointManager(f"s3://{bucket}/at-once", keep=2)
        now._saving.stream_uploads = not folder
        now.load(state)
        now.save(1, state)
        fig["at_once"].append(now.last_stall_s)
        now.close()
    c0 = cpu.now()
    before = raw_multipart(client, bucket, f"raw/{r}a", data)
    fig["cpu_raw"].append(cpu.since(c0))
    t0, c0 = time.perf_counter(), cpu.now()
    ckpt.save(2, state)
    fig["stall_async"].append(ckpt.last_stall_s)
    ckpt.wait()
    fig["ours"].append(time.perf_counter() - t0)
    fig["cpu_ours"].append(cpu.since(c0))
    fig["phases"].append(dict(ckpt.last_phases))
    fig["sizes"].append(ckpt.store.read_manifest(2).total_size)
    ckpt.close()
    after = raw_multipart(client, bucket, f"raw/{r}b", data)
    fig["raw"].append((before + after) / 2)  # raw on both sides: a drift hits both alike
    fig["control"].append(before / after)  # raw / raw: how far two runs of one upload differ

    ckpt = CheckpointManager(f"s3://{bucket}/block{r}", keep=2, async_upload=False)
    ckpt.save(1, state)
    ckpt.save(2, state)
    fig["stall_block"].append(ckpt.last_stall_s)
    ckpt.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="state size in MB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--folder",
        action="store_true",
        help="save through a local staging folder instead of streaming (the old path)",
    )
    ap.add_argument("--volume-mb", type=int, default=1024, help="SeaweedFS volume size")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server: a line per request
    torch.set_num_threads(1)

    n_layers = max(1, round(args.mb * 1e6 / (4096 * 4096 * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(n_layers)])
    state = {"model": model, "step": 0}
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    server, work = _start_server(nbytes, args.repeats, args.volume_mb)
    cpu = _Cpu(server)
    os.environ.update(server.env())
    client = server.client()
    bucket = server.make_bucket("bench")
    blob = io.BytesIO()
    torch.save(model.state_dict(), blob)  # the same tensors' bytes, as one object in memory
    data = blob.getvalue()

    print(f"state: {nbytes / 1e6:.0f} MB, server: {server.kind} at {server.endpoint}, "
          f"data in {work}")  # fmt: skip
    fig: dict[str, list] = collections.defaultdict(list)
    try:
        for r in range(args.repeats):
            _one_run(r, fig, state, bucket, client, data, args.folder, cpu)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    _report(fig, nbytes, len(data))


def _report(fig: dict[str, list], nbytes: int, raw_bytes: int) -> None:
    med = statistics.median
    raw, ours, stall_async = fig["raw"], fig["ours"], fig["stall_async"]
    mbps = lambda s: nbytes / 1e6 / s  # noqa: E731
    ratios = sorted(a / b for a, b in zip(raw, ours, strict=True))
    print(f"bytes moved: checkpoint {max(fig['sizes']) / 1e6:.1f} MB (all its files), "
          f"raw {raw_bytes / 1e6:.1f} MB")  # fmt: skip
    print(f"raw boto3 multipart upload : {med(raw):6.2f} s  ({mbps(med(raw)):5.0f} MB/s)")
    print(f"checkpoint save+upload     : {med(ours):6.2f} s  ({mbps(med(ours)):5.0f} MB/s)")
    for key, what in PHASES.items():
        values = [p[key] for p in fig["phases"] if key in p]
        if values:
            print(f"  {what:<52}: {med(values):6.3f} s (median)")
    for key, what in (("cpu_raw", "raw upload"), ("cpu_ours", "checkpoint save")):
        client_s, server_s = (med([c[i] for c in fig[key]]) for i in (0, 1))
        print(f"CPU per {what:<16}: client {client_s:5.2f} core·s, server {server_s:5.2f} "
              "core·s (median)")  # fmt: skip
    print(f"training stall, async save : {med(stall_async):6.3f} s")
    print(f"training stall, blocking   : {med(fig['stall_block']):6.3f} s")
    print(f"load (empty bucket)        : {med(fig['load_s']):6.3f} s; staging buffers allocated "
          f"in the background by {med(fig['warm_s']):.3f} s")  # fmt: skip
    first = med(fig["first_stall"])
    print(f"first async save after load: {first:6.3f} s ({first / med(stall_async):.2f}x a later "
          f"one); right after load, no step between: {fig['at_once'][0]:.3f} s (waits for the "
          "allocation)")  # fmt: skip
    pairs = "  ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(raw, ours, strict=True))
    print(f"runs, raw s (mean of the uploads before and after) / checkpoint s: {pairs}")
    control = sorted(fig["control"])
    print(f"noise floor, raw before / raw after over {len(control)} runs: min {control[0]:.2f}  "
          f"median {med(control):.2f}  max {control[-1]:.2f}")  # fmt: skip
    lo, mid, hi = ratios[0], med(ratios), ratios[-1]
    print(f"throughput ratio (raw time / checkpoint time) over {len(ratios)} runs: "
          f"min {lo:.2f}  median {mid:.2f}  max {hi:.2f}")  # fmt: skip
    print(f"  goal median ≥ 0.95: {'MET' if mid >= 0.95 else 'MISSED'};  "
          f"goal min ≥ 0.85: {'MET' if lo >= 0.85 else 'MISSED'}")  # fmt: skip
    stall = med(stall_async) / med(fig["stall_block"])
    print(f"stall ratio (async / blocking): {stall:.3f}  goal ≤ 0.1  "
          f"{'MET' if stall <= 0.1 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
