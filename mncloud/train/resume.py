"""`CheckpointManager.load`: the newest step that verifies, restored in place on every rank.

Rank 0 lists the verified steps (COMPLETE matches the manifest, every file present at its
size) and, for the step tried, reads the manifest and DCP's metadata once for every rank (so
the world does not read them world-size times); each rank reads its own extras (`rank_N.pt`,
checked whole). DCP then loads through the bucket reader (`reader.py`): each saved item
fetched once, checked against its chunk hashes, handed to the ranks that need it. A step whose
reads fail anywhere (a short read, a missing object, a chunk that fails its hash) is refused
on every rank before a tensor is touched, its file and bytes logged, and the next older step
is tried. A checkpoint of another model (`ModelMismatch`) or a node without room for its share
(`NoRoom`) ends the load with one line and exit code 2: nothing retries those.
"""

from __future__ import annotations

import io
import logging
import pickle
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, NoReturn

import torch

from mncloud.errors import CheckpointError, MncloudError
from mncloud.storage.buckets import ObjectNotFoundError
from mncloud.storage.checkpoints import DCP_METADATA, CheckpointStore, Manifest, hash_bytes
from mncloud.storage.rangeread import StepFiles
from mncloud.storage.shapes import SHAPES_KEY
from mncloud.train.collectives import Collectives
from mncloud.train.reader import BucketReader, NoRoom
from mncloud.train.state import Refusal, restore_state

log = logging.getLogger("mncloud.train.ckpt")

Opened = tuple[Manifest, Any, dict[str, Any], bool]
"""A step ready to load: its manifest, DCP's metadata, this rank's extras, whether they are
this rank's own."""


class Resume:
    """One `load` of the checkpoints in `store`, on the ranks of `ranks`."""

    def __init__(
        self, store: CheckpointStore, ranks: Collectives, *, verify_sha256: bool, spill_dir: Path
    ) -> None:
        self.store = store
        self.ranks = ranks
        self.verify_sha256 = verify_sha256
        self.spill_dir = spill_dir
        self.stats: dict[str, float] = {}
        """What this rank's read of the loaded step cost (`BucketReader.stats`)."""

    def load(self, state: MutableMapping[str, Any], step: int | None) -> int | None:
        """The step restored into `state` (the newest that verifies, or `step`), or None."""
        for cand in self._candidates(step):
            opened = self._open_step(cand)
            if isinstance(opened, str):
                log.warning("checkpoint step %d skipped: %s", cand, opened)
                continue
            manifest, metadata, extras, own_rng = opened
            files = StepFiles(self.store, manifest, whole_files=self.verify_sha256)
            reader = BucketReader(files, metadata, pg=self.ranks.dcp_pg,
                                  distributed=self.ranks.distributed,
                                  spill_dir=self.spill_dir)  # fmt: skip
            try:
                restore_state(state, reader, extras, manifest.step, pg=self.ranks.dcp_pg,
                              distributed=self.ranks.distributed, own_rng=own_rng,
                              saved_shapes=_saved_shapes(manifest))  # fmt: skip
            except CheckpointError:
                if reader.no_room is not None:
                    self._refuse(NoRoom(reader.no_room))
                if reader.failed is not None:  # the bucket, not the step: no older one
                    raise CheckpointError(reader.failed) from None
                if reader.refused is None:
                    raise
                log.warning("checkpoint step %d skipped: %s", cand, reader.refused)
                continue
            except Refusal as err:  # every rank: the same manifest, the same model
                self._refuse(err)
            self.stats = reader.stats
            log.info("resumed from checkpoint step %d at %s (%s)", cand, self.store.uri,
                     _read_figures(reader.stats, manifest))  # fmt: skip
            return cand
        log.info("no usable checkpoint at %s; starting from scratch", self.store.uri)
        return None

    def _refuse(self, err: Refusal) -> NoReturn:
        """End the load with a refusal nothing should retry: said once, left in the marker."""
        if self.ranks.rank == 0:
            log.error("%s", err)
        err.leave_marker()
        raise err

    def _candidates(self, step: int | None) -> list[int]:
        """Rank 0 lists the verified steps (newest first; only `step` if given) for every
        rank; CheckpointError on every rank when listing fails or `step` does not verify."""
        candidates: list[int] | str = []
        if self.ranks.rank == 0:
            try:
                good, skipped = self.store.candidates()
                for v in skipped:
                    log.warning("checkpoint step %d skipped: %s", v.step, v.reason)
                if step is not None:
                    good = [step] if step in good else []
                    if not good:
                        candidates = f"step {step} at {self.store.uri} does not verify"
                if isinstance(candidates, list):
                    candidates = good
            except MncloudError as err:
                candidates = str(err)
        candidates = self.ranks.broadcast(candidates)
        if isinstance(candidates, str):
            raise CheckpointError(candidates)
        return candidates

    def _open_step(self, step: int) -> Opened | str:
        """A step's manifest and DCP metadata (read and checked once, by rank 0) and this
        rank's extras, with whether they are its own; or, on every rank alike, why the step is
        not usable. A bucket that does not answer is CheckpointError on every rank instead (an
        outage is no reason to take an older step). A rank the saving world did not have
        (resumed on more ranks) takes rank 0's extras: the sampler's cursor and other values
        every rank shares (its RNG states stay its own, see `restore_state`). DCP reshards the
        tensors."""
        head: tuple[Manifest, bytes] | tuple[str, str] = ("", "")
        if self.ranks.rank == 0:
            try:
                manifest = self.store.read_manifest(step)
                head = (manifest, self._checked_file(manifest, DCP_METADATA))
            except (CheckpointError, ObjectNotFoundError) as err:
                head = ("skip", str(err))
            except MncloudError as err:
                head = ("fatal", str(err))
        head = self.ranks.broadcast(head)
        if isinstance(head[0], str):
            return _unusable([head], ranked=False)
        manifest, raw_metadata = head
        rank = self.ranks.rank
        own = f"rank_{rank}.pt"
        mine = own in manifest.files
        if not mine:
            if rank == manifest.world_size:  # the first of the ranks it did not have
                log.info("step %d was saved by %d ranks; ranks from %d on take rank 0's "
                         "extras and keep their own RNG states", step, manifest.world_size,
                         rank)  # fmt: skip
            own = "rank_0.pt"
        error: tuple[str, str] | None = None
        extras: dict[str, Any] = {}
        try:
            extras = torch.load(io.BytesIO(self._checked_file(manifest, own)), weights_only=False)
        except (CheckpointError, ObjectNotFoundError) as err:
            error = ("skip", str(err))
        except MncloudError as err:
            error = ("fatal", str(err))
        errors = self.ranks.all_gather(error)
        if any(errors):
            return _unusable(errors, ranked=True)
        return manifest, pickle.loads(raw_metadata), extras, mine

    def _checked_file(self, manifest: Manifest, name: str) -> bytes:
        """A small file of the step, read whole and checked against its manifest entry."""
        entry = manifest.files.get(name)
        if entry is None:
            raise CheckpointError(f"step {manifest.step} has no {name}")
        raw = self.store.bucket.get_bytes(self.store.key(manifest.step, name))
        if len(raw) != entry.size:
            raise CheckpointError(f"{name} is {len(raw)} bytes, manifest says {entry.size}")
        if hash_bytes(raw, entry.algo) != entry.digest:
            raise CheckpointError(f"{name} {entry.algo} differs from the manifest")
        return raw


def _unusable(errors: list[Any], *, ranked: bool) -> str:
    """Why a step is not usable, from each rank's (kind, message) or None (each message
    named by its rank when `ranked`); CheckpointError when the bucket did not answer (on every
    rank alike: each has every rank's)."""
    said = [(f"rank {r}: " if ranked else "", e) for r, e in enumerate(errors) if e]
    fatal = [who + msg for who, (kind, msg) in said if kind == "fatal"]
    if fatal:
        raise CheckpointError(f"the checkpoints could not be read: {'; '.join(fatal)}")
    return "; ".join(who + msg for who, (_kind, msg) in said)


def _read_figures(stats: dict[str, float], manifest: Manifest) -> str:
    """What this rank's share of a resume cost, for the log line."""
    if not stats:
        return "nothing to read"
    return (f"this rank fetched {stats['fetched_bytes'] / 1e6:.1f} MB of the step's "
            f"{manifest.total_size / 1e6:.1f} MB in {stats['fetch_s']:.1f}s, received "
            f"{stats['received_bytes'] / 1e6:.1f} MB from other ranks")  # fmt: skip


def _saved_shapes(manifest: Manifest) -> dict[str, list[int]] | None:
    """The model tensors' shapes the manifest records (None: saved before they were)."""
    shapes = manifest.extra.get(SHAPES_KEY)
    return shapes if isinstance(shapes, dict) and shapes else None
