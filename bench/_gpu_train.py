"""The job `bench/gpu.py` kills and resumes: a deterministic MLP trained on CUDA (NCCL) or CPU.

    torchrun --standalone --nproc_per_node=1 bench/_gpu_train.py --steps 300 \
        --progress progress.jsonl --out result.json        # with $MNCLOUD_CKPT_URI set

Like `examples/train_ddp.py`, but the model, its dropout masks and every batch live on the GPU
when there is one (the example keeps its tensors on the CPU), so a resume has to restore CUDA
tensors and the CUDA RNG. Determinism: `seed_everything` turns on
`torch.use_deterministic_algorithms` (`CUBLAS_WORKSPACE_CONFIG=:4096:8`), `wrap_ddp` keeps the
gradient buckets fixed. Rank 0 appends one JSON line per step to `--progress` and writes the
sha256 of the final weights and optimizer state to `--out`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mncloud.train import (
    CheckpointManager,
    ResumableSampler,
    cleanup,
    init_distributed,
    seed_everything,
    wrap_ddp,
)

FEATURES, CLASSES = 256, 16


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--samples", type=int, default=16384)
    p.add_argument("--interval", type=int, default=25, help="steps between checkpoints")
    p.add_argument("--step-delay", type=float, default=0.02, help="seconds slept per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", required=True, help="JSON lines, one per step (rank 0)")
    p.add_argument("--out", required=True, help="final result JSON (rank 0)")
    return p.parse_args()


def synthetic_data(samples: int, seed: int) -> TensorDataset:
    """Gaussian inputs, labels from a fixed random teacher: learnable, nothing downloaded."""
    g = torch.Generator().manual_seed(seed + 10_000)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 64, generator=g), torch.randn(64, CLASSES, generator=g)
    return TensorDataset(x, (torch.tanh(x @ w1) @ w2).argmax(dim=1))


def make_model(hidden: int, layers: int) -> nn.Module:
    dims = [FEATURES, *[hidden] * layers]
    body: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        body += [nn.Linear(a, b), nn.GELU(), nn.Dropout(0.1)]  # dropout: the RNG must resume too
    return nn.Sequential(*body, nn.Linear(dims[-1], CLASSES))


def digest(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[str, str]:
    """sha256 of the exact bits of the weights, and of the optimizer's state tensors."""
    hashes = []
    for sd in (model.state_dict(), opt.state_dict()["state"]):
        h = hashlib.sha256()
        for key, val in sd.items():
            tensors = val.items() if isinstance(val, dict) else [("", val)]
            for sub, t in tensors:
                if isinstance(t, torch.Tensor):
                    h.update(f"{key}.{sub}".encode())
                    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        hashes.append(h.hexdigest())
    return hashes[0], hashes[1]


def main() -> None:
    args = parse_args()
    t_start = time.time()
    d = init_distributed(timeout_s=120)
    seed_everything(args.seed)
    dev = torch.device("cuda", d.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    data = synthetic_data(args.samples, args.seed)
    sampler = ResumableSampler(data, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        generator=torch.Generator())  # fmt: skip
    torch.manual_seed(args.seed)
    model = make_model(args.hidden, args.layers).to(dev)
    ddp, ddp_mode = wrap_ddp(model), "wrap_ddp exact"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    ckpt = CheckpointManager(interval_steps=args.interval, keep=2)
    state = {"model": model, "optimizer": opt, "sampler": sampler, "loss": 0.0}
    t0 = time.perf_counter()
    start = ckpt.load(state) or 0
    load_s = time.perf_counter() - t0
    log = open(args.progress, "a") if d.rank == 0 else None  # noqa: SIM115
    if log:
        log.write(json.dumps({"event": "start", "t": time.time(), "t_process": t_start,
                              "resumed_from": start, "load_s": load_s,
                              "backend": torch.distributed.get_backend()
                              if d.distributed else None, "device": str(dev),
                              "ddp": ddp_mode}) + "\n")  # fmt: skip
        log.flush()
    step, loss, epoch = start, float(state["loss"]), sampler.epoch
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            out = loss_fn(ddp(x.to(dev)), y.to(dev))
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
            step += 1
            loss = out.item()
            state["loss"] = loss
            ckpt.maybe_save(step, state)
            if log:
                log.write(json.dumps({"step": step, "t": time.time(), "loss": loss}) + "\n")
                log.flush()
            time.sleep(args.step_delay)
            if step >= args.steps:
                break
        epoch += 1
    ckpt.save(step, state, wait=True)
    ckpt.close()
    if d.rank == 0:
        weights, optim = digest(model, opt)
        result = {"steps": step, "loss": loss, "resumed_from": start, "weights_sha256": weights,
                  "optimizer_sha256": optim, "world_size": d.world_size}  # fmt: skip
        Path(args.out).write_text(json.dumps(result))
    cleanup()


if __name__ == "__main__":
    main()
