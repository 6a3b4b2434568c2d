"""A DCP `StorageReader` over the bucket: a resume reads only the byte ranges its ranks load.

`CheckpointManager.load` hands DCP a `BucketReader` for the step it tries. DCP plans the load
(each rank's `ReadItem`s: which saved item feeds which slice of its tensors, resharded when the
world or the mesh changed); `prepare_local_plan` turns a rank's items into the byte ranges of
the shard files they live in; on the coordinator, `prepare_global_plan` gives each rank its
`fetchplan.Share` (each item fetched once by one of the ranks that need it, then exchanged);
`read_data` then runs on every rank:

1. fetch: this rank's items, as verified ranged reads (`storage.rangeread`: chunk hashes from
   the step's sidecars), into memory, or into a file in the staging folder when memory is short;
2. agree: every rank says whether its reads verified. If one did not (a short read, a missing
   object, a chunk that fails its hash), every rank raises before any tensor is touched, with
   the file and bytes named in `refused`, and `CheckpointManager.load` tries the next older
   step. If a rank has neither memory nor disk for its share, `no_room` says so, with sizes;
3. load: the items this rank fetched and needs, then each exchange round's
   (`all_to_all_single` on the checkpoint's gloo group), deserialized as DCP's own
   `FileSystemReader` does (`torch.load`, narrowed to the requested slice, copied in place).

The bucket serves each saved item once (plus at most a chunk at each end of a run), whatever
the world size: the world size × the checkpoint it served when every rank pulled every shard.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import mmap
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from mncloud.errors import CheckpointError
from mncloud.storage.rangeread import Range, RangeRefused, StepFiles, memory
from mncloud.train.fetchplan import ROUND_BYTES, Exchange, Share, assign
from mncloud.train.itembytes import ViewFile, tensor_in_place
from mncloud.train.state import Refusal

log = logging.getLogger("mncloud.train.ckpt")

_MARGIN = 256 * 2**20
"""Memory or disk left free beyond a resume's buffers."""


class NoRoom(Refusal):
    """A rank has neither the memory nor the disk to hold its share of a resume."""


def _transforms() -> Any:
    """DCP's loader of stream transforms (a save with extensions, e.g. compression), or None
    where this torch has none."""
    try:
        from torch.distributed.checkpoint.filesystem import _StorageReaderTransforms
    except ImportError:
        return None
    return _StorageReaderTransforms()


class BucketReader(StorageReader):
    """Reads one committed step (`files`) whose DCP metadata is `metadata` (read once by the
    caller). `pg` is the group DCP loads on (None in one process); buffers that do not fit in
    memory go to `spill_dir`."""

    def __init__(
        self,
        files: StepFiles,
        metadata: Metadata,
        *,
        pg: Any,
        distributed: bool,
        spill_dir: Path,
        round_bytes: int = ROUND_BYTES,
    ) -> None:
        super().__init__()
        self.files = files
        self.metadata = metadata
        self.pg = pg
        self.distributed = distributed
        self.spill_dir = spill_dir
        self.round_bytes = round_bytes
        self.storage_data: dict[Any, Any] = {}
        self.refused: str | None = None
        """Why the step was refused (set on every rank alike), else None."""
        self.no_room: str | None = None
        """Why a rank could not hold its share (set on every rank alike), else None."""
        self.failed: str | None = None
        """Why the bucket could not be read (set on every rank alike), else None."""
        self.stats: dict[str, float] = {}
        """This rank's bytes fetched, sent and received, and seconds fetching and loading."""
        self._transforms = _transforms()

    # ------------------------------------------------------------------ DCP's planning
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Nothing to reset: one reader serves one load of one step."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self.metadata, "storage_meta", None) is None:
            self.metadata.storage_meta = StorageMeta()
        assert self.metadata.storage_meta is not None
        self.metadata.storage_meta.load_id = uuid.uuid4().hex
        return self.metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise RangeRefused(f"step {self.files.manifest.step}'s DCP metadata has no storage")
        self.storage_data = metadata.storage_data

    def _range(self, item: ReadItem) -> Range:
        info = self.storage_data[item.storage_index]
        return (info.relative_path, info.offset, info.offset + info.length)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        needed = sorted({self._range(item) for item in plan.items})
        return dataclasses.replace(plan, storage_data=needed)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        shares = assign([p.storage_data or [] for p in plans], self.round_bytes)
        return [dataclasses.replace(p, storage_data=s) for p, s in zip(plans, shares, strict=True)]

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    # ------------------------------------------------------------------ reading
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        share: Share = plan.storage_data
        wanted: dict[Range, list[ReadItem]] = {}
        for item in plan.items:
            wanted.setdefault(self._range(item), []).append(item)
        t0 = time.perf_counter()
        fetched = self._fetch(share)
        t1 = time.perf_counter()
        for rng in share.fetch:
            if rng in wanted:
                self._load(fetched[rng], wanted[rng], planner)
        sent = received = 0
        loaded = {rng for rng in share.fetch if rng in wanted}
        for rnd in share.rounds:
            for rng, data in self._exchange(rnd, fetched):
                received += len(data)
                self._load(data, wanted[rng], planner)
                loaded.add(rng)
            sent += sum(e - s for items in rnd.send.values() for _, s, e in items)
        if missed := sorted(set(wanted) - loaded):  # never: each needed item is fetched or sent
            raise CheckpointError(
                f"{len(missed)} item(s) of this rank's were not read: {missed[0]}"
            )
        self.stats = {"fetched_bytes": self.files.fetched_bytes, "sent_bytes": sent,
                      "received_bytes": received, "fetch_s": t1 - t0,
                      "load_s": time.perf_counter() - t1}  # fmt: skip
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _fetch(self, share: Share) -> dict[Range, memoryview]:
        """This rank's items, verified; then every rank agrees that all verified. Else every
        rank raises alike: the step refused (`refused`: a short read, a missing object, a
        failed hash), no room (`no_room`), or the bucket unreadable (`CheckpointError`: an
        outage is no reason to take an older step)."""
        status: tuple[str, str] | None = None
        fetched: dict[Range, memoryview] = {}
        try:
            alloc = self._allocator(share)
            fetched = self.files.read(share.fetch, alloc)
        except NoRoom as err:
            status = ("room", str(err))
        except RangeRefused as err:
            status = ("refused", str(err))
        except Exception as err:  # the bucket after its retries, this node's memory
            status = ("error", f"{type(err).__name__}: {err}")
        statuses = [status]
        if self.distributed:
            statuses = [None] * dist.get_world_size(self.pg)
            dist.all_gather_object(statuses, status, group=self.pg)
        said = {kind: [f"rank {r}: {s[1]}" for r, s in enumerate(statuses) if s and s[0] == kind]
                for kind in ("room", "error", "refused")}  # fmt: skip
        if said["room"]:
            self.no_room = said["room"][0].partition(": ")[2]
            raise NoRoom(self.no_room)
        step = self.files.manifest.step
        if said["error"]:
            self.failed = f"step {step} could not be read: {'; '.join(said['error'])}"
            raise CheckpointError(self.failed)
        if said["refused"]:
            self.refused = "; ".join(said["refused"])
            raise RangeRefused(self.refused)
        return fetched

    def _allocator(self, share: Share) -> Any:
        """Memory for the fetched items when this node's ranks all fit (with a margin), else
        a file in `spill_dir` when its disk has room; NoRoom (sizes and path) when neither."""
        need = share.fetch_bytes + len(share.fetch) * 2 * (self.files.chunk_size or 0)
        exchange = 2 * self.round_bytes if share.rounds else 0
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        free_ram = psutil.virtual_memory().available
        if ranks_here * (need + exchange) + _MARGIN <= free_ram:
            return memory
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        free_disk = shutil.disk_usage(self.spill_dir).free
        short_ram = bool(exchange) and ranks_here * exchange + _MARGIN > free_ram
        if short_ram or ranks_here * need + _MARGIN > free_disk:
            raise NoRoom(
                f"resuming step {self.files.manifest.step} needs {need / 1e9:.2f} GB for each "
                f"of this node's {ranks_here} rank(s): {free_ram / 1e9:.2f} GB of memory free "
                f"and {free_disk / 1e9:.2f} GB free at {self.spill_dir}; free some, or resume "
                f"on more nodes"
            )
        log.info("resume of step %d: %.2f GB of this rank's share staged on disk at %s "
                 "(memory is short)", self.files.manifest.step, need / 1e9,
                 self.spill_dir)  # fmt: skip
        return self._mapped

    def _mapped(self, n: int) -> memoryview:
        """A writable buffer of n bytes backed by an unlinked file in `spill_dir`."""
        if n == 0:
            return memoryview(bytearray())
        with tempfile.TemporaryFile(dir=self.spill_dir, prefix="mncloud-resume-") as f:
            f.truncate(n)
            return memoryview(mmap.mmap(f.fileno(), n))

    def _exchange(self, rnd: Exchange, fetched: dict[Range, memoryview]) -> list[tuple[Range, Any]]:
        """One round: send the items others need, receive this rank's; the received items."""
        world = dist.get_world_size(self.pg)
        size = lambda items: sum(e - s for _, s, e in items)  # noqa: E731
        in_splits = [size(rnd.send.get(r, [])) for r in range(world)]
        out_splits = [size(rnd.recv.get(r, [])) for r in range(world)]
        send = torch.empty(sum(in_splits), dtype=torch.uint8)
        at = 0
        for dst in range(world):
            for rng in rnd.send.get(dst, []):
                n = rng[2] - rng[1]
                if n:
                    send[at : at + n] = torch.frombuffer(fetched[rng], dtype=torch.uint8)
                at += n
        recv = torch.empty(sum(out_splits), dtype=torch.uint8)
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=self.pg)
        view = memoryview(recv.numpy())
        got, at = [], 0
        for src in range(world):
            for rng in rnd.recv.get(src, []):
                n = rng[2] - rng[1]
                got.append((rng, view[at : at + n]))
                at += n
        return got

    def _load(self, data: Any, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        """One saved item's bytes into every slice of this rank's state that reads from it:
        a tensor viewed where its bytes lie (`itembytes`), else as DCP's own reader does."""
        info = self.storage_data[reqs[0].storage_index]
        if info.transform_descriptors:
            if self._transforms is None:
                raise RangeRefused(f"{info.relative_path}: this torch cannot undo its "
                                   f"transforms {info.transform_descriptors}")  # fmt: skip
            stream = self._transforms.transform_load_stream(
                reqs[0], info.transform_descriptors, ViewFile(data)
            )
            data = memoryview(stream.read(-1))
        if reqs[0].type == LoadItemType.BYTE_IO:
            raw = bytes(data)
            for req in reqs:
                planner.load_bytes(req, io.BytesIO(raw))
            return
        tensor = tensor_in_place(data)
        if tensor is None:
            tensor = torch.load(ViewFile(data), map_location="cpu", weights_only=True)
        for req in reqs:
            piece = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != piece.size():
                shapes = f"{tuple(piece.size())}, not {tuple(target.size())}"
                raise CheckpointError(f"{info.relative_path}: {req.storage_index} is {shapes}")
            target.copy_(piece)
            planner.commit_tensor(req, target)
