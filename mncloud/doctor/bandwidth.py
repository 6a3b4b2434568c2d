"""The preflight's all-reduce bandwidth test: after the gang check, one rank per node all-reduces
a few message sizes with the run's backend (NCCL on GPUs, gloo on CPUs) and node 0 reports the
bus bandwidth as nccl-tests defines it (`busbw = bytes / time × 2(n−1)/n`, doc/PERFORMANCE.md),
against what the plan expected for the offer's fabric (rendered as `--expect-busbw`).

Below `WARN_FRACTION` of the expectation it warns with the likely causes; below
`--min-bandwidth` it refuses (exit 78, one line) before training. The local backend's fabric,
loopback, is reported and not judged: its simulated nodes share this machine's cores, so the
figure is those cores' and moves with whatever else runs (2 nodes on a 2-core machine: 1.2-1.7
GB/s quiet, docs/benchmarks.md; 0.37 GB/s under other work), not a network's. No cause the
warning names (an interface, a fabric not enabled, distant nodes) can apply to it and no
nominal rate predicts it, so there it warns at no figure; `--min-bandwidth`, a floor the user
sets, still refuses. Node 0 writes the figure to `<ckpt uri>/runs/<run-id>/bandwidth.json`
(status and the run record read it there) and, as a `bandwidth` event, to the run's telemetry
segments. A local relaunch on nodes that all predate that figure is handed it (`known_figure`)
and judges it instead of measuring again.
`time_allreduce` is the timing loop `bench/allreduce.py` reuses.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from mncloud import layout

#: Message sizes (bytes) the preflight all-reduces: small (latency) to large (bandwidth).
SIZES = (1 << 20, 8 << 20, 32 << 20)
#: Below this fraction of the expected bus bandwidth the preflight warns.
WARN_FRACTION = 0.25
#: The first word of the local backend's fabric (`plan/hardware.yaml`'s `loopback`, rendered
#: as `--fabric 'loopback (local backend)'`): a figure over it is not judged (module docstring).
LOOPBACK = "loopback"
FILE_NAME = "bandwidth.json"


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s: algbw × 2(n−1)/n."""
    if world < 2 or seconds <= 0:
        return 0.0
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def time_allreduce(nbytes: int, *, iters: int = 5, warmup: int = 2, device: str = "cpu") -> float:
    """Median seconds of one all-reduce of `nbytes` (float32) over the default process group."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    times = []
    for i in range(warmup + iters):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class Bandwidth:
    """What the test measured (node 0's view) and what it was held against."""

    nodes: int
    backend: str
    busbw_gbs: float
    """Bus bandwidth of the largest message: the figure status shows."""
    sizes: dict[int, float] = field(default_factory=dict)
    """Bytes → bus bandwidth GB/s."""
    expected_gbs: float | None = None
    fabric: str | None = None
    run_id: str | None = None
    at: float = field(default_factory=time.time)

    @property
    def on_loopback(self) -> bool:
        """Measured between the local backend's simulated nodes (this machine's cores)."""
        return (self.fabric or "").split(" ")[0] == LOOPBACK

    @property
    def short(self) -> bool:
        """Far below what its fabric should give (never on loopback): the preflight warns."""
        expected = self.expected_gbs or 0.0
        return not self.on_loopback and self.busbw_gbs < WARN_FRACTION * expected

    def line(self) -> str:
        """One line for the log and `status`."""
        text = f"all-reduce bus bandwidth {self.busbw_gbs:.2f} GB/s between {self.nodes} nodes"
        text += f" ({self.backend})"
        if self.on_loopback:
            text += " over loopback: this machine's shared CPUs, not a network (not judged)"
        elif self.expected_gbs:
            share = self.busbw_gbs / self.expected_gbs
            text += f", {share:.0%} of the {self.expected_gbs:.2f} GB/s expected"
            text += f" for {self.fabric}" if self.fabric else ""
        return text


def sweep(rank: int, nodes: int, sizes: tuple[int, ...] = SIZES) -> Bandwidth:
    """All-reduce each size over the initialised group; bus bandwidth per size."""
    import torch
    import torch.distributed as dist

    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    per_size = {}
    for n in sizes:
        # The slowest node's time: every node then holds the same figures and verdict.
        slowest = torch.tensor([time_allreduce(n, device=device)], device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        per_size[n] = bus_bandwidth(n, float(slowest.item()), nodes)
    return Bandwidth(nodes, str(dist.get_backend()), per_size[max(sizes)], per_size)


def measure(
    rank: int, nodes: int, master: str, port: int, timeout: float, sizes: tuple[int, ...] = SIZES
) -> Bandwidth:
    """Join the nodes in a process group on master:port (freed by the gang check), sweep, leave.

    Raises RuntimeError (or torch's error) when a node cannot join or the all-reduce fails.
    """
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master}:{port}",
        rank=rank,
        world_size=nodes,
        timeout=timedelta(seconds=timeout),
    )
    try:
        return sweep(rank, nodes, sizes)
    finally:
        dist.destroy_process_group()


def judge(result: Bandwidth, minimum: float | None) -> tuple[list[str], list[str]]:
    """(failures, warnings): below `--min-bandwidth` refuses; far below expected warns."""
    if minimum is not None and result.busbw_gbs < minimum:
        return [
            f"preflight failed on node 0: {result.line()}, below --min-bandwidth "
            f"{minimum:g} GB/s; {_causes(result)}"
        ], []
    if result.short:
        return [], [
            f"preflight warning: {result.line()} (below {WARN_FRACTION:.0%}); {_causes(result)}"
        ]
    return [], []


def _causes(result: Bandwidth) -> str:
    causes = "likely causes: NCCL_SOCKET_IFNAME names a slow interface (try --nccl-socket-ifname)"
    if result.fabric and "EFA" in result.fabric:
        causes += ", EFA not enabled (FI_PROVIDER=efa, a DLAMI/EFA image, --network best)"
    elif result.fabric and ("TCPX" in result.fabric or "InfiniBand" in result.fabric):
        causes += ", the fabric not enabled (--network best, its image and NCCL plugin)"
    return causes + ", or busy or distant nodes (no placement group)"


def publish(result: Bandwidth, bucket_uri: str | None) -> None:
    """Node 0: the figure to the bucket (status, the run record) and, as a `bandwidth` event,
    to the run's telemetry segments (`telemetry.series`)."""
    from mncloud.telemetry.series import writer_from_env

    payload = asdict(result)
    writer = writer_from_env()
    if writer is not None:
        writer.add({"k": "event", "t": time.time(), "event": "bandwidth", **payload})
        writer.close()
    run_id = result.run_id
    if bucket_uri and run_id:
        from mncloud.storage import join_key, open_bucket

        bucket, prefix = open_bucket(layout.record_uri(bucket_uri, run_id))
        bucket.put_bytes(join_key(prefix, FILE_NAME), json.dumps(payload).encode())


def known_figure(text: str | None, nodes: int) -> Bandwidth | None:
    """A published figure handed to a relaunch (`constants.BANDWIDTH_KNOWN_ENV`), when it is
    one of `nodes` nodes; None (measure) when absent or unreadable."""
    try:
        data = json.loads(text or "")
        known = {k: data[k] for k in Bandwidth.__dataclass_fields__ if k in data}
        figure = Bandwidth(**known)
        figure.sizes = {int(k): float(v) for k, v in figure.sizes.items()}
    except (ValueError, TypeError, AttributeError):
        return None
    return figure if figure.nodes == nodes else None


def published(figures: dict[str, Any]) -> Bandwidth:
    """Published figures (`bandwidth.json`, a record's) as a `Bandwidth`."""
    known = {k: figures[k] for k in Bandwidth.__dataclass_fields__ if k in figures}
    return Bandwidth(**known)


def describe(figures: dict[str, Any]) -> str:
    """The one line `status` shows for published figures."""
    return published(figures).line()


def read(ckpt_uri: str, run_id: str) -> dict[str, Any] | None:
    """The published figure of run `run_id`, or None when there is none."""
    from mncloud.storage import ObjectNotFoundError, join_key, open_bucket

    bucket, prefix = open_bucket(layout.record_uri(ckpt_uri, run_id), retry_seconds=2)
    try:
        data = json.loads(bucket.get_bytes(join_key(prefix, FILE_NAME)))
    except (ObjectNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None
