"""The preflight's all-reduce bandwidth test vs a raw `torch.distributed` loop, same run.

    python bench/allreduce.py                 # 2 and 3 local nodes, gloo over loopback
    python bench/allreduce.py --nodes 2 --repeats 5

Each "node" is a process (one rank, as the preflight runs one rank per node) in a gloo group
over 127.0.0.1. Per message size it takes the bus bandwidth (nccl-tests: bytes / time ×
2(n−1)/n) of (a) the preflight's own path, `mncloud.doctor.bandwidth.sweep` (median of 5 timed
all-reduces after 2 warm-ups, the slowest node's time agreed by one more all-reduce), and (b) a
raw loop, the same number of back-to-back `dist.all_reduce` calls timed as one block. The ratio
preflight / raw shows the preflight's own overhead (≈1 means none). Prints one JSON line per
(nodes, size) and a table; figures go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.multiprocessing as mp

SIZES = (1 << 20, 8 << 20, 32 << 20)


def _raw_loop(nbytes: int, iters: int, warmup: int) -> float:
    """Seconds per all-reduce of a plain loop, timed as one block after the warm-ups."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(nbytes // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    return (time.perf_counter() - start) / iters


def _node(rank: int, nodes: int, port: int, repeats: int, out: mp.Queue) -> None:
    import torch.distributed as dist

    from mncloud.doctor import bandwidth

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=nodes,
        timeout=timedelta(seconds=120),
    )
    try:
        for _ in range(repeats):
            ours = bandwidth.sweep(rank, nodes, SIZES).sizes
            raw = {n: bandwidth.bus_bandwidth(n, _raw_loop(n, 5, 2), nodes) for n in SIZES}
            if rank == 0:
                out.put((ours, raw))
    finally:
        dist.destroy_process_group()


def run(nodes: int, repeats: int) -> list[dict[str, float]]:
    from tests.servers import free_port

    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_node, args=(r, nodes, port, repeats, queue)) for r in range(nodes)]
    for p in procs:
        p.start()
    samples = [queue.get(timeout=600) for _ in range(repeats)]
    for p in procs:
        p.join(timeout=60)
    rows = []
    for size in SIZES:
        ours = statistics.median(s[0][size] for s in samples)
        raw = statistics.median(s[1][size] for s in samples)
        rows.append({
            "nodes": nodes, "mib": size >> 20, "preflight_gbs": round(ours, 3),
            "raw_gbs": round(raw, 3), "ratio": round(ours / raw, 3) if raw else 0.0,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 3])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [row for n in args.nodes for row in run(n, args.repeats)]
    for row in rows:
        print(json.dumps(row))
    print("\nnodes  MiB  preflight GB/s  raw GB/s  ratio")
    for r in rows:
        print(
            f"{r['nodes']:5d} {r['mib']:4d} {r['preflight_gbs']:15.3f} {r['raw_gbs']:9.3f} "
            f"{r['ratio']:6.3f}"
        )


if __name__ == "__main__":
    main()
