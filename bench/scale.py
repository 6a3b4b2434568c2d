"""#57 in one run: what mncloud reads and how fast, at the sizes users train.

    .venv/bin/python bench/scale.py [--only resume,ckpt,ckptdir,status] [--json]

Each part is a module of its own, runnable alone, with its method in its docstring:

- `resume` (`_scale_resume.py`): a 16-node × 8-rank FSDP checkpoint of 2 GB resumed on the
  same world and on 12 nodes: bytes the S3 server served (counted at a proxy) and wall time,
  against each rank reading exactly its share and against the pull before #57 (every rank every
  shard);
- `ckpt` (`_scale_ckpt.py`): `CheckpointManager`'s save and resume of a 2 GB state against
  boto3's transfer manager copying the same bytes at its best concurrency;
- `ckptdir` (`_scale_ckptdir.py`): a `--ckpt-dir` restore of 10 committed checkpoints (bytes
  served, before and after), and a 2 GB unit's restore and upload against the transfer manager;
- `status` (`_scale_status.py`): `status NAME` of 16 ranks × 20,000 steps ÷ 10 steps, `status`
  and `runs ls` over 1,000 records ÷ over one, quiet and under load; a 512-rank 72-hour run's
  telemetry objects, requests per node-hour and their price at S3's list prices.

On this repository's 2-core machine the whole run takes about 25 minutes; the figures are in
docs/benchmarks.md ("At users' sizes").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def _resume() -> dict[str, float]:
    import _scale_resume

    return _scale_resume.figures()


def _ckpt() -> dict[str, float]:
    import _scale_ckpt

    return _scale_ckpt.figures(gb=2, repeats=5)


def _ckptdir() -> dict[str, float]:
    import _scale_ckptdir

    return _scale_ckptdir.figures(repeats=5)


def _status() -> dict[str, float]:
    import _scale_status

    return _scale_status.figures()


PARTS: dict[str, Callable[[], dict[str, float]]] = {
    "resume": _resume,
    "ckpt": _ckpt,
    "ckptdir": _ckptdir,
    "status": _status,
}


def summary(f: dict[str, dict[str, float]]) -> list[str]:
    """The headline of each part that ran (goals in brackets)."""
    lines = []
    if r := f.get("resume"):
        size = r["checkpoint_bytes"]
        lines += [
            f"resume of a {size / 1e9:.2f} GB checkpoint saved by {r['world']:.0f} ranks "
            "(bytes served ÷ the checkpoint's; wall s):",
            f"  mncloud   {r['mncloud_bytes'] / size:7.3f}×  {r['mncloud_s']:7.1f}s  [≤ 1.25×]",
            f"  ideal     {r['ideal_bytes'] / size:7.3f}×  {r['ideal_s']:7.1f}s",
            f"  before    {r['today_bytes'] / size:7.3f}×  {r['today_s']:7.1f}s (one node's, "
            "× the nodes)",
            f"  resumed on {r['reshard_world']:.0f} ranks: {r['reshard_bytes'] / size:.3f}×, "
            f"{r['reshard_exchanged_bytes'] / 1e9:.2f} GB handed between ranks",
        ]
    for part, label in (("ckpt", "CheckpointManager"), ("ckptdir", "--ckpt-dir")):
        if c := f.get(part):
            lines.append(
                f"{label}: upload {c[f'{part}_upload_vs_raw']:.2f}× and restore "
                f"{c[f'{part}_restore_vs_raw']:.2f}× the transfer manager at its best [≥ 0.9]"
            )
    if c := f.get("ckptdir"):
        lines.append(
            f"--ckpt-dir restore of {c['ckptdir_units']:.0f} checkpoints: "
            f"{c['ckptdir_restore_bytes_ratio']:.2f}× the bytes served before"
        )
    if s := f.get("status"):
        for key, label in (("status_name", "status NAME 20,000 ÷ 10 steps"),
                           ("status_all", "status 1,000 ÷ 1 records"),
                           ("runs_ls", "runs ls 1,000 ÷ 1 records")):  # fmt: skip
            quiet, load = s[f"{key}_ratio_quiet"], s[f"{key}_ratio_load"]
            lines.append(f"{label}: {quiet:.2f}× quiet, {load:.2f}× under load [≤ 1.5×]")
        lines.append(
            f"512 ranks × 72 h: {s['telemetry_objects_512x72h']:,.0f} telemetry objects, "
            f"{s['puts_per_node_hour']:,.0f} PUTs per node-hour (${s['put_usd_per_node_hour']}),"
            f" a status ${s['status_usd_512']} (${s['status_usd_512_before']} before)"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default=",".join(PARTS), help="parts to run, comma-separated")
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    args = p.parse_args()
    wanted = [w for w in args.only.split(",") if w]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; the parts: {', '.join(PARTS)}")
    figures: dict[str, dict[str, float]] = {}
    for part in wanted:
        t0 = time.perf_counter()
        figures[part] = PARTS[part]()
        print(f"{part}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(figures, indent=1))
    print("\n".join(summary(figures)))


if __name__ == "__main__":
    main()
