"""Who reads what of a resume: every saved item is fetched from the bucket once, by one rank.

DCP's global planning step (on the coordinator) sees every rank's load plan, so it knows, for
each item of the checkpoint (a byte range of a shard file: a saved tensor chunk or a pickled
value), which ranks need it. `assign` picks one of those ranks to fetch it (the least loaded,
so the reads spread over the world) and plans the exchange that hands it to the others, in
rounds of bounded size (one `all_to_all_single` each on the checkpoint's gloo group, so no
rank holds more than `round_bytes` of other ranks' items at once). The bucket then serves
each item once, whatever the world size, and ranks of one node never fetch the same bytes.

Example sequences (items A, B of rank 0's shard file, C, D of rank 1's):

    same world (FSDP, 2 ranks → 2): rank 0 needs A, B; rank 1 needs C, D. Each fetches its
        own; no exchange.
    resharded (2 ranks → 3): rank 0 needs A; rank 1 needs A, C (its new shard straddles the
        old boundary); rank 2 needs C, D. Rank 0 fetches A, rank 1 fetches C, rank 2 fetches
        D; one round: rank 0 sends A to rank 1, rank 1 sends C to rank 2.
    replicated (DDP, 4 ranks): every rank needs A-D; each fetches one and the round sends it
        to the three others (each item still leaves the bucket once).

Torch-free: the reader (`train.reader`) turns each rank's `Share` into reads and collectives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mncloud.storage.rangeread import Range

ROUND_BYTES = 512 * 2**20
"""Bytes a rank sends, and receives, in one exchange round at most (one item may exceed it)."""


@dataclass
class Exchange:
    """One round of a rank: the items it sends to each rank and receives from each, in the
    order both sides use (an `all_to_all_single`'s splits, rank by rank)."""

    send: dict[int, list[Range]] = field(default_factory=dict)
    recv: dict[int, list[Range]] = field(default_factory=dict)


@dataclass
class Share:
    """A rank's part of a resume: what it fetches, and its exchange rounds (every rank has
    the same number of rounds, some empty)."""

    fetch: list[Range] = field(default_factory=list)
    rounds: list[Exchange] = field(default_factory=list)

    @property
    def fetch_bytes(self) -> int:
        """Bytes of the items this rank fetches."""
        return sum(end - start for _, start, end in self.fetch)


def _fetchers(needers: dict[Range, list[int]], world: int) -> dict[Range, int]:
    """Each item's fetcher: its only needer, else the needer that fetched least so far (the
    one that fetched the item just before it in the file on a tie, so runs stay whole)."""
    load = [0] * world
    last: dict[str, tuple[int, int]] = {}  # file -> (end of the previous item, its fetcher)
    chosen: dict[Range, int] = {}
    for item in sorted(needers):
        name, start, end = item
        ranks = needers[item]
        prev_end, prev_rank = last.get(name, (-1, -1))
        follows = prev_end == start and prev_rank in ranks
        rank = min(ranks, key=lambda r: (load[r], not (follows and r == prev_rank), r))
        chosen[item] = rank
        load[rank] += end - start
        last[name] = (end, rank)
    return chosen


def assign(needs: Sequence[Iterable[Range]], round_bytes: int = ROUND_BYTES) -> list[Share]:
    """Each rank's `Share`, from each rank's needed items (`needs[rank]`)."""
    world = len(needs)
    needers: dict[Range, list[int]] = {}
    for rank, items in enumerate(needs):
        for item in items:
            needers.setdefault(item, []).append(rank)
    chosen = _fetchers(needers, world)
    shares = [Share() for _ in range(world)]
    for item in sorted(chosen):
        shares[chosen[item]].fetch.append(item)
    rounds: list[list[tuple[int, int, Range]]] = [[]]
    sent, got = [0] * world, [0] * world
    for item in sorted(chosen):
        src, size = chosen[item], item[2] - item[1]
        others = [r for r in needers[item] if r != src]
        if not others:
            continue
        full = sent[src] + size * len(others) > round_bytes or any(
            got[r] + size > round_bytes for r in others
        )
        if full and rounds[-1]:
            rounds.append([])
            sent, got = [0] * world, [0] * world
        sent[src] += size * len(others)
        for dst in others:
            got[dst] += size
            rounds[-1].append((src, dst, item))
    for moves in (r for r in rounds if r):
        exchanges = [Exchange() for _ in range(world)]
        for src, dst, item in moves:
            exchanges[src].send.setdefault(dst, []).append(item)
            exchanges[dst].recv.setdefault(src, []).append(item)
        for rank in range(world):
            shares[rank].rounds.append(exchanges[rank])
    return shares
