"""A distributed sampler that remembers where it is, so a resumed run sees the same batches,
on any number of ranks.

    sampler = ResumableSampler(dataset, seed=0)            # rank and world size from dist
    loader = DataLoader(dataset, batch_size=32, sampler=sampler,
                        generator=torch.Generator())       # keep the global RNG untouched
    state = {"model": model, "optimizer": opt, "sampler": sampler}
    ckpt.load(state)                                       # restores epoch and cursor
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)                           # no-op for the resumed epoch
        for batch in loader: ...                           # resumes mid-epoch

The order within an epoch is a permutation seeded by `seed + epoch` (the same on every rank).
The position is global: `cursor` samples of that order were consumed by all ranks together
(every rank takes as many samples per step, so after p samples on each of W ranks the first
p × W of the order are consumed, no more, no less). The rest of the epoch, `order[cursor:]`, is
split across the ranks as DistributedSampler splits a whole epoch. The checkpoint holds the
cursor, the same on every rank, so a run resumed on another number of ranks continues with the
next unconsumed sample: none is skipped or seen twice in an epoch. At the same world size the
order is exactly the one of a run that never stopped. `position` counts the indices this rank
handed out since the cursor; it is exact with `num_workers=0`. With worker processes the loader
fetches ahead, and a resumed run skips the prefetched samples.

A checkpoint of an older mncloud (a per-rank `position`, no cursor) loads as a cursor of
`position × this world size`: exact when resumed on the same number of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from mncloud.train.dist import data_shard


class ResumableSampler(Sampler[int]):
    """Shuffled, rank-split indices with a checkpointable epoch and global cursor."""

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
        self.start = 0
        """Samples of this epoch's order consumed (by all ranks) when this world began it."""
        self.position = 0
        """Indices this rank handed out since `start`."""

    @property
    def cursor(self) -> int:
        """Samples of the current epoch's order consumed by all ranks together."""
        return self.start + self.position * self.num_replicas

    @property
    def num_samples(self) -> int:
        """Indices this rank hands out from `start` to the end of the epoch."""
        rest = max(self.n - self.start, 0)
        if self.drop_last and rest % self.num_replicas:
            return rest // self.num_replicas
        return math.ceil(rest / self.num_replicas)

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        end = self.start + self.num_samples * self.num_replicas
        if len(order) < end:  # pad by repeating, as DistributedSampler does
            order += (order * math.ceil(end / max(len(order), 1)))[: end - len(order)]
        return order[self.start + self.rank : end : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self._indices()
        while self.position < len(indices):
            i = indices[self.position]
            self.position += 1
            yield i
        # The epoch is exhausted: the next iteration starts the next one.
        self.epoch += 1
        self.start = self.position = 0

    def __len__(self) -> int:
        return self.num_samples - self.position

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning; a no-op when already in it (as after a resume)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.start = self.position = 0

    def state_dict(self) -> dict[str, Any]:
        """Epoch and global cursor (and this rank's position, for older readers)."""
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "position": self.position,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved epoch and cursor, on this sampler's number of ranks."""
        self.epoch = int(state["epoch"])
        if "cursor" in state:
            self.start = int(state["cursor"])
        else:  # an older checkpoint: a per-rank position, written on (we assume) this world
            self.start = int(state["position"]) * self.num_replicas
        self.position = 0
        self.seed = int(state.get("seed", self.seed))
