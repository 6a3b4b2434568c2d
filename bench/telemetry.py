"""Telemetry's cost to training: a loop's step time with `mncloud.train.report` on vs off, and
the bucket objects each rank writes per hour.

    python bench/telemetry.py [--steps 2000] [--step-ms 10] [--repeats 3] [--interval 30]
                              [--bucket file|s3]

Each step sleeps `--step-ms` (modeled accelerator time: the host waits, as on a GPU node) and
then, in the "on" arms, reports the step and a loss (`mncloud.train.report(step, loss=…)`)
with the run's variables set, so the segments go to a `file://` bucket in a temporary folder
from the writer's own thread. Arms alternate off/on so drift hits both alike; the figure is
the ratio of the median step times (goal ≤ 1.01× at 10 ms steps). Objects per rank per hour
are the segments written over the writer's lifetime (its thread writes what the "on" arms
buffered, also during the "off" arms), the final flush at exit included.

`--bucket s3` writes to a SeaweedFS server on 127.0.0.1 (the suite's) instead of `file://`.
Then the writer's CPU per segment (50 segments written one after the other, the process's CPU
time) says what a rank's telemetry costs the host at the local backend's 0.5 s interval.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mncloud import constants, layout

SEGMENTS_TIMED = 50


def arm(steps: int, step_s: float, on: bool, start: int) -> list[float]:
    """Per-step wall times of one arm (steps numbered from `start`)."""
    from mncloud.train import report

    times = []
    last = time.perf_counter()
    for step in range(start, start + steps):
        time.sleep(step_s)
        if on:
            report(step, loss=1.0 / step)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--interval", type=float, default=30.0, help="seconds between segments")
    p.add_argument("--bucket", choices=["file", "s3"], default="file")
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="mncloud-telemetry-bench-")
    server = _s3_server(Path(folder)) if args.bucket == "s3" else None
    ckpt = f"s3://{server.make_bucket()}/exp" if server else f"file://{folder}/exp"
    os.environ.update({
        constants.CKPT_URI_ENV: ckpt, constants.RUN_ID_ENV: "bench-1", "RANK": "0",
        constants.TELEMETRY_INTERVAL_ENV: str(args.interval),
    })  # fmt: skip
    from mncloud.telemetry.series import read_series
    from mncloud.train import steptime

    off: list[float] = []
    on: list[float] = []
    step, began = 1, time.perf_counter()
    for _ in range(args.repeats):
        off += arm(args.steps, args.step_ms / 1000, False, step)
        on += arm(args.steps, args.step_ms / 1000, True, step)
        step += args.steps
    writer = steptime._series
    writer.close()
    alive_s = time.perf_counter() - began  # the writer's thread runs through every arm
    cpu_per_segment = _cpu_per_segment(writer)
    series = read_series(layout.series_uri(ckpt, "bench-1"))
    result = {
        "step_ms": args.step_ms,
        "steps_per_arm": args.steps,
        "repeats": args.repeats,
        "interval_s": args.interval,
        "median_off_ms": round(statistics.median(off) * 1000, 4),
        "median_on_ms": round(statistics.median(on) * 1000, 4),
        "mean_off_ms": round(statistics.mean(off) * 1000, 4),
        "mean_on_ms": round(statistics.mean(on) * 1000, 4),
        "ratio_median": round(statistics.median(on) / statistics.median(off), 4),
        "ratio_mean": round(statistics.mean(on) / statistics.mean(off), 4),
        "segments": writer.segments,
        "objects_per_rank_hour": round(writer.segments / alive_s * 3600, 1),
        "records_per_segment": round(len(series.steps) / max(writer.segments, 1)),
        "steps_read_back": len(series.steps),
        "skipped": series.skipped,
        "bucket": args.bucket,
        "cpu_ms_per_segment": round(cpu_per_segment * 1000, 2),
        "cpu_share_at_0.5s": round(cpu_per_segment / 0.5, 4),
    }
    if server is not None:
        server.stop()
    print(json.dumps(result, indent=2))


def _cpu_per_segment(writer: object) -> float:
    """This process's CPU seconds per segment written (the writer closed: its thread is done,
    each `flush` here writes one segment of one record)."""
    from mncloud.telemetry.series import SeriesWriter

    assert isinstance(writer, SeriesWriter)
    started = time.process_time()
    for i in range(SEGMENTS_TIMED):
        writer.add({"k": "step", "t": time.time(), "step": 10**6 + i})
        writer.flush()
    return (time.process_time() - started) / SEGMENTS_TIMED


def _s3_server(work: Path) -> object:
    """The suite's SeaweedFS on a free port (its variables set for the writer)."""
    from tests.servers import S3Server, free_port

    server = S3Server("seaweedfs", free_port(), work / "s3")
    server.start()
    os.environ.update(server.env())
    return server


if __name__ == "__main__":
    main()
