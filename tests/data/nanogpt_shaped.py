"""A script shaped like nanoGPT's `train.py`: its own training loop, settings as
`--key=value` overrides, `out_dir/ckpt.pt` written by rank 0 every `eval_interval` iterations,
and a resume only with `--init_from=resume` (the default, `scratch`, ignores `ckpt.pt`).
Nothing of mncloud in it; DDP over torchrun's environment as nanoGPT does.

    torchrun --nproc_per_node=2 tests/data/nanogpt_shaped.py --out_dir=out --max_iters=60
    ... --init_from=resume                           # what a user adds by hand to resume

At the end rank 0 writes the model's weights to `out_dir/final.pt` (a state dict).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# nanoGPT's configurator: globals overridden by `--key=value`.
out_dir = "out"
init_from = "scratch"
max_iters = 60
eval_interval = 10
batch_size = 8
learning_rate = 1e-2
dropout = 0.0  # nanoGPT's default: with dropout its resume is not exact (no RNG saved)
seed = 1337
compute_ms = 0.0
for arg in sys.argv[1:]:
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals() or not arg.startswith("--"):
        raise SystemExit(f"unknown config key: {arg}")
    globals()[key] = type(globals()[key])(value)


def batch(it: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch drawn from the iteration and rank alone (nanoGPT draws from the data's memmap)."""
    gen = np.random.default_rng(seed * 1_000_003 + it * 101 + rank)
    x = torch.from_numpy(gen.standard_normal((batch_size, 16)).astype(np.float32))
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    iter_num = 0
    if init_from == "resume":
        ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        iter_num = ckpt["iter_num"]
        print(f"resuming from iteration {iter_num}", flush=True)
    ddp = DDP(model)
    while iter_num < max_iters:
        x, y = batch(iter_num, rank)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        iter_num += 1
        time.sleep(compute_ms / 1000)
        if iter_num % eval_interval == 0 and rank == 0:  # nanoGPT: always_save_checkpoint
            os.makedirs(out_dir, exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "iter_num": iter_num}  # fmt: skip
            torch.save(state, os.path.join(out_dir, "ckpt.pt"))
            print(f"iter {iter_num}: loss {loss.item():.4f}, saved ckpt.pt", flush=True)
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out_dir, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
