"""A small sharded (FSDP2) transformer run that survives preemptions and resumes on any node count.

    mncloud up examples/train_fsdp.py --cloud local --nodes 2 --gpus cpu:2 --name lm
    mncloud up examples/train_fsdp.py --nodes 4 --gpus H100:8 --parallel hsdp --name lm
    mncloud up examples/train_fsdp.py --nodes 4 --gpus H100:8 --recovery node --name lm
    torchrun --nproc_per_node=4 examples/train_fsdp.py --steps 100      # without mncloud

A decoder-only transformer (causal attention through `scaled_dot_product_attention`) learns
synthetic token sequences generated from a seed (each sequence steps through the vocabulary by
its own stride, so the next token is predictable; nothing is downloaded). `mncloud.train`'s
`parallelize` shards each block, then the root, with FSDP2's `fully_shard` (`--parallel`, or
`mncloud up --parallel`: fsdp, hsdp or ddp); bf16 compute on GPUs, fp32 on CPU. Every optimizer
step trains `--global-batch` sequences whatever the number of ranks: the micro-batches per
step come from `accumulation_steps`, and the `ResumableSampler`'s global cursor hands out each
sequence once per epoch across a change of node count. Gradients are clipped to `--clip`;
`--activation-checkpointing` recomputes each block's activations in the backward pass.

A `CheckpointManager` saves the sharded model and optimizer (each rank writes its own shard)
every `--ckpt-interval` steps; `mncloud up --resume` with another `--nodes` reshards them.
Under node recovery (`--recovery node`) each node is a replica sharded over its own ranks, and
`Replicas` averages the shards across nodes: a lost node costs one replica, not the run.
`--sample-log DIR` writes, per rank, the sequence ids each step trained on (`DIR/rank-R.jsonl`,
with the launch's run id: a step trained again after a preemption counts once, from the last).
At the end, `final.json` (steps, final loss, sha256 of the gathered weights) beside the
checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from mncloud.train import (
    CheckpointManager,
    Progress,
    Replicas,
    ResumableSampler,
    accumulation_steps,
    cleanup,
    init_distributed,
    parallelize,
    seed_everything,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in total")
    p.add_argument("--global-batch", type=int, default=24, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per rank per pass")
    p.add_argument("--samples", type=int, default=960, help="sequences in the data set")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    p.add_argument("--parallel", default="fsdp", choices=["ddp", "fsdp", "hsdp"],
                   help="the script's choice; `mncloud up --parallel` overrides it")  # fmt: skip
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--ckpt-interval", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--sample-log", type=Path, help="write each rank's sample ids per step here")
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="sleep this long per micro-batch, standing for accelerator time: "
                   "fewer ranks take more micro-batches a step, so longer steps")  # fmt: skip
    return p.parse_args()


def synthetic_tokens(samples: int, seq_len: int, vocab: int, seed: int) -> TensorDataset:
    """(id, tokens): sequence i starts at a random token and steps by its own stride."""
    g = torch.Generator().manual_seed(seed + 20_000)
    start = torch.randint(0, vocab, (samples, 1), generator=g)
    stride = torch.randint(1, 8, (samples, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
    return TensorDataset(torch.arange(samples), tokens)


class Block(nn.Module):
    """Pre-norm attention (causal, through `scaled_dot_product_attention`) and an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm and the output head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.activation_checkpointing = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x).flatten(0, 1))  # (batch × seq, vocab): not a view


def make_model(args: argparse.Namespace) -> TinyLM:
    return TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq_len)


def weights_sha256(model: nn.Module) -> tuple[str, dict[str, torch.Tensor]]:
    """The gathered (full) weights on rank 0 and a fingerprint of their exact bits."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))  # fmt: skip
    h = hashlib.sha256()
    for key in sorted(full):
        h.update(key.encode())
        h.update(full[key].detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest(), full


def batches(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches without end: the sampler moves to the next epoch by itself."""
    while True:
        yield from loader


class StepBatches:
    """Each step's `accum` micro-batches, step after step: what `Replicas.steps` hands out (a
    new iteration, after a heal, continues from the sampler's position)."""

    def __init__(self, loader: DataLoader, accum: int) -> None:
        self.loader, self.accum = loader, accum

    def __iter__(self) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        micro = batches(self.loader)
        while True:
            yield [next(micro) for _ in range(self.accum)]


def main() -> None:
    args = parse_args()
    d = init_distributed(timeout_s=120)
    logging.basicConfig(
        level=logging.INFO if d.rank == 0 else logging.WARNING, format="%(message)s"
    )
    seed_everything(args.seed)
    device = torch.device(f"cuda:{d.local_rank}" if torch.cuda.is_available() else "cpu")

    data = synthetic_tokens(args.samples, args.seq_len, args.vocab, args.seed)
    sampler = ResumableSampler(data, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.micro_batch, sampler=sampler, drop_last=True,
                        generator=torch.Generator())  # fmt: skip
    accum = accumulation_steps(args.global_batch, args.micro_batch)  # for this world size
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = make_model(args).to(device)
    model.activation_checkpointing = args.activation_checkpointing
    run = parallelize(model, blocks=model.blocks, default=args.parallel)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = {"model": model, "optimizer": opt, "sampler": sampler, "loss": 0.0}
    replicas = Replicas(state)  # node recovery: this node's replica; else the plain loop
    ckpt = CheckpointManager(interval_steps=args.ckpt_interval, keep=2, replicas=replicas)
    start = ckpt.load(state) or 0
    progress = Progress(ckpt, replicas, rank=d.rank)
    progress.event(event="start", resumed_from=start, world_size=d.world_size)
    if d.rank == 0:
        how = f"resumed from step {start}" if start else "from scratch"
        print(f"training {args.steps} steps on {d.world_size} ranks ({accum} micro-batches "
              f"per step), {how}", flush=True)  # fmt: skip
    sample_log = None
    if args.sample_log:
        args.sample_log.mkdir(parents=True, exist_ok=True)
        sample_log = (args.sample_log / f"rank-{d.rank}.jsonl").open("a")

    step, loss = start, float(state["loss"])
    steps = replicas.steps(StepBatches(loader, accum), start=start, total=args.steps)
    for step, micro_batches in steps:
        opt.zero_grad(set_to_none=True)
        ids: list[int] = []
        total = torch.zeros((), device=device)
        for i, (sample_ids, tokens) in enumerate(micro_batches):
            ids += sample_ids.tolist()
            tokens = tokens.to(device)
            last = i == accum - 1
            with sync(run, last):
                logits = run(tokens[:, :-1])
                out = F.cross_entropy(logits.float(), tokens[:, 1:].flatten())
                (out / accum).backward()
            total += out.detach() / accum
            if args.compute_ms:  # a benchmark's model of GPU time: the host waits, idle
                time.sleep(args.compute_ms / 1000)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if not replicas.step(opt):  # a peer node was lost mid-step: this batch comes again
            continue
        loss = global_mean(total)
        state["loss"] = loss
        if sample_log is not None:
            launch = os.environ.get("MNCLOUD_RUN_ID")  # each launch of a run has its own
            record = {"step": step, "world": d.world_size, "run": launch, "ids": ids}
            sample_log.write(json.dumps(record) + "\n")
            sample_log.flush()
        saved = ckpt.maybe_save(step, state)
        stall = {"ckpt_s": round(ckpt.last_stall_s, 4)} if saved else {}
        progress.event(step=step, loss=round(loss, 6), **stall)
        if d.rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step:5d}  loss {loss:.4f}", flush=True)
    step, loss = replicas.committed_step, float(state["loss"])
    ckpt.save(step, state, wait=True)  # the final state too (a no-op if just saved)
    ckpt.close()

    digest, _ = weights_sha256(model)
    if d.rank == 0:
        result = {"steps": step, "final_loss": loss, "weights_sha256": digest,
                  "world_size": d.world_size}  # fmt: skip
        progress.finish(**result)
        print(f"done: {json.dumps(result)}", flush=True)
    replicas.close()
    cleanup()


def sync(run: nn.Module, last: bool) -> contextlib.AbstractContextManager[None]:
    """Reduce gradients only on a step's last micro-batch (FSDP2 and DDP alike)."""
    if hasattr(run, "set_requires_gradient_sync"):  # an FSDPModule
        run.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    if hasattr(run, "no_sync") and not last:  # DDP
        return run.no_sync()
    return contextlib.nullcontext()


def global_mean(value: torch.Tensor) -> float:
    """The mean of `value` over every rank (the step's loss on the whole global batch)."""
    if torch.distributed.is_initialized():
        value = value.clone()
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.SUM)
        value /= torch.distributed.get_world_size()
    return float(value)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
