"""A distributed sampler that remembers where it is, so a resumed run sees the same batches.

    sampler = ResumableSampler(dataset, seed=0)            # rank and world size from dist
    loader = DataLoader(dataset, batch_size=32, sampler=sampler,
                        generator=torch.Generator())       # keep the global RNG untouched
    state = {"model": model, "optimizer": opt, "sampler": sampler}
    ckpt.load(state)                                       # restores epoch and position
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)                           # no-op for the resumed epoch
        for batch in loader: ...                           # resumes mid-epoch

The order within an epoch is a permutation seeded by `seed + epoch` (the same on every rank),
split across ranks as DistributedSampler does. `position` counts the indices this rank handed
out in the current epoch; it is exact with `num_workers=0`. With worker processes the loader
fetches ahead, and a resumed run skips the prefetched samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from mncloud.train.dist import data_shard


class ResumableSampler(Sampler[int]):
    """Shuffled, rank-split indices with a checkpointable epoch and position."""

    def __init__(
        self,
        dataset: Sized,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        shard, shards = data_shard()  # under node recovery: over every node's ranks
        self.num_replicas = shards if num_replicas is None else num_replicas
        self.rank = shard if rank is None else rank
        self.n = len(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        if drop_last and self.n % self.num_replicas:
            self.num_samples = self.n // self.num_replicas
        else:
            self.num_samples = math.ceil(self.n / self.num_replicas)

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        total = self.num_samples * self.num_replicas
        if len(order) < total:  # pad by repeating, as DistributedSampler does
            order += (order * math.ceil(total / max(len(order), 1)))[: total - len(order)]
        return order[:total][self.rank : total : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self._indices()
        while self.position < len(indices):
            i = indices[self.position]
            self.position += 1
            yield i
        # The epoch is exhausted: the next iteration starts the next one.
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return self.num_samples - self.position

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning; a no-op when already in it (as after a resume)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def state_dict(self) -> dict[str, Any]:
        """Epoch and position, for the checkpoint."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved epoch and position."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
