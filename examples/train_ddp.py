"""A small but real data-parallel training run that survives preemptions, bit for bit.

    mncloud up examples/train_ddp.py --cloud local --nodes 2 --gpus cpu:2 --name demo
    torchrun --nproc_per_node=2 examples/train_ddp.py --steps 100      # without mncloud

An MLP learns a fixed random "teacher" network's labels on a synthetic data set (generated from
a seed, so nothing is downloaded). Every rank sees its own shard through a `ResumableSampler`;
DDP averages the gradients over gloo (CPU) or NCCL (GPU). A `CheckpointManager` saves model,
optimizer, sampler position and RNG states every `--ckpt-interval` steps to `$MNCLOUD_CKPT_URI`
and, after a preemption, `load` resumes from the newest complete step, so the final weights are
the same bits as those of a run that never stopped.

A `Progress` reports each step to mncloud: its loss and checkpoint stall go to the run's
telemetry in the bucket on every backend (`mncloud.train.report`: `mncloud metrics`, the web
view's loss curve, the goodput ledger) with its start and end events (a local run's summary
reads how many steps a preemption cost and how long the resume took off them); at the end,
`final.json` (steps, final loss, sha256 of the final weights) beside the checkpoints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mncloud.train import (
    CheckpointManager,
    Progress,
    Replicas,
    ResumableSampler,
    cleanup,
    init_distributed,
    seed_everything,
    wrap_ddp,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=256, help="width of the hidden layers")
    p.add_argument("--samples", type=int, default=8192, help="size of the synthetic data set")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ckpt-interval", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="sleep this long per step, standing for accelerator time (the CPU is free then)",
    )
    return p.parse_args()


def synthetic_data(samples: int, seed: int, features: int = 64, classes: int = 10):  # type: ignore[no-untyped-def]
    """Inputs from a Gaussian, labels from a fixed random teacher MLP: learnable, no download."""
    g = torch.Generator().manual_seed(seed + 10_000)
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, 32, generator=g), torch.randn(32, classes, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(hidden: int, features: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, classes),
    )


def weights_sha256(model: nn.Module) -> str:
    """A fingerprint of the exact bits of every parameter and buffer."""
    h = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    args = parse_args()
    d = init_distributed(timeout_s=120)
    # Checkpoint news once (rank 0); warnings from every rank.
    logging.basicConfig(
        level=logging.INFO if d.rank == 0 else logging.WARNING, format="%(message)s"
    )
    seed_everything(args.seed)  # per rank; fixed thread count from MNCLOUD_CPU_THREADS

    data = synthetic_data(args.samples, args.seed)
    sampler = ResumableSampler(data, seed=args.seed, drop_last=True)
    loader = DataLoader(
        data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        generator=torch.Generator(),  # iterating must not draw from the global RNG
    )  # fmt: skip
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = make_model(args.hidden)
    ddp = wrap_ddp(model)  # keeps gradient buckets stable, so a resume is bitwise exact
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    state = {"model": model, "optimizer": opt, "sampler": sampler, "loss": 0.0}
    # Node recovery (`--recovery node`, the default for this script on 2+ nodes locally or on
    # a cloud with a bucket): each node a replica group that survives the loss of another;
    # under gang recovery (`--recovery gang`, or plain torchrun) a plain loop.
    replicas = Replicas(state)
    ckpt = CheckpointManager(interval_steps=args.ckpt_interval, keep=2, replicas=replicas)
    start = ckpt.load(state) or 0
    progress = Progress(ckpt, replicas, rank=d.rank)
    progress.event(event="start", resumed_from=start, world_size=d.world_size)
    if d.rank == 0:
        how = f"resumed from step {start}" if start else "from scratch"
        print(f"training {args.steps} steps on {d.world_size} ranks, {how}", flush=True)

    step, loss = start, float(state["loss"])
    for step, (x, y) in replicas.steps(loader, start=start, total=args.steps):
        out = loss_fn(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        out.backward()
        if args.compute_ms:  # a benchmark's model of GPU time: the host waits, idle
            time.sleep(args.compute_ms / 1000)
        if not replicas.step(opt):  # a peer node was lost mid-step: this batch comes again
            continue
        loss = out.item()
        state["loss"] = loss
        saved = ckpt.maybe_save(step, state)
        stall = {"ckpt_s": round(ckpt.last_stall_s, 4)} if saved else {}  # for the goodput ledger
        progress.event(step=step, loss=round(loss, 6), **stall)
        if d.rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step:5d}  loss {loss:.4f}", flush=True)
    step, loss = replicas.committed_step, float(state["loss"])
    ckpt.save(step, state, wait=True)  # the final state too (a no-op if just saved)
    ckpt.close()

    if d.rank == 0:
        result = {
            "steps": step,
            "final_loss": loss,
            "weights_sha256": weights_sha256(model),
            "world_size": d.world_size,
        }
        progress.finish(**result)
        print(f"done: {json.dumps(result)}", flush=True)
    replicas.close()
    cleanup()


if __name__ == "__main__":
    main()
