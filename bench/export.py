"""Export benchmark: `mncloud export` of a checkpoint against `torch.load` of the same tensors.

A model of `--mb` MB (float32 Linear layers) and its AdamW state are saved by a one-process
`CheckpointManager` into a local folder (the checkpoint holds model + two moments: about three
times `--mb`); the model's state dict is also written with `torch.save` to one file. Then, each
in a fresh process (`--repeats` times, median):

    torch.load      torch.load(one file, weights_only=True): the floor, reading the tensors once
    safetensors     export_checkpoint(..., fmt="safetensors"): verify, download (here a copy
                    with content hashes), DCP read of the model only, safetensors write, sha256
    torch           the same into one torch.save file
    bf16            safetensors with --dtype bfloat16

Printed for each: wall seconds, the ratio to torch.load, and peak RSS above the process's
RSS after its imports (sampled every 2 ms: what the work itself took), as a multiple of
the model's size.

    .venv/bin/python bench/export.py [--mb 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Run in a fresh process: import, note the RSS, time the action, report the peak RSS.
CHILD = """
import json, sys, threading, time, psutil, torch
from mncloud.export import export_checkpoint
import mncloud.export.run  # torch, safetensors, DCP: imported before the baseline
me, peak, done = psutil.Process(), [0], threading.Event()
def sample():
    while not done.wait(0.002):
        peak[0] = max(peak[0], me.memory_info().rss)
base = me.memory_info().rss
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
t0 = time.perf_counter()
exec(sys.argv[1])
seconds = time.perf_counter() - t0
done.set()
sampler.join()
print(json.dumps({"s": seconds, "extra_mb": (max(peak[0], me.memory_info().rss) - base) / 2**20}))
"""

CASES = {
    "torch.load": "torch.load({ref!r}, weights_only=True)",
    "safetensors": "export_checkpoint({uri!r}, 'latest', {out!r}, fmt='safetensors')",
    "torch": "export_checkpoint({uri!r}, 'latest', {out!r}, fmt='torch')",
    "bf16": "export_checkpoint({uri!r}, 'latest', {out!r}, dtype='bfloat16')",
}


def make_checkpoint(folder: Path, mb: int) -> tuple[str, Path, int]:
    """A checkpoint (model + AdamW state) of a ~`mb` MB model, and the model in one file."""
    import torch

    from mncloud.train import CheckpointManager

    width = 2048
    layers = max(1, round(mb * 2**20 / (4 * (width * width + width))))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    uri = f"file://{folder / 'ckpt'}"
    ckpt = CheckpointManager(uri, keep=2, async_upload=False, watch_preemption=False)
    ckpt.save(1, {"model": model, "optimizer": opt})
    ckpt.close()
    ref = folder / "model.pt"
    torch.save(model.state_dict(), ref)
    return uri, ref, sum(t.nbytes for t in model.state_dict().values())


def measure(code: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=128, help="model size in MB (float32)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mncloud-bench-export-"))
    try:
        uri, ref, model_bytes = make_checkpoint(folder, args.mb)
        ckpt_bytes = sum(f.stat().st_size for f in (folder / "ckpt").rglob("*") if f.is_file())
        print(f"model {model_bytes / 1e6:.0f} MB; checkpoint {ckpt_bytes / 1e6:.0f} MB "
              f"(model + AdamW moments); {args.repeats} runs each, median")  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
        for _ in range(args.repeats):
            for name, template in CASES.items():
                out = folder / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                results[name].append(measure(template.format(uri=uri, out=str(out), ref=str(ref))))
        floor = statistics.median(r["s"] for r in results["torch.load"])
        print(f"{'':12} {'seconds':>8} {'÷ torch.load':>13} {'peak RSS':>9} {'× model':>8}")
        for name, runs in results.items():
            seconds = statistics.median(r["s"] for r in runs)
            extra = statistics.median(r["extra_mb"] for r in runs)
            print(f"{name:12} {seconds:8.2f} {seconds / floor:13.1f} {extra:7.0f}MB "
                  f"{extra * 2**20 / model_bytes:8.2f}")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
