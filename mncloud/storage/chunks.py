"""Per-chunk content hashes of a checkpoint's shard files, so a ranged read is verified alone.

A resume reads only the byte ranges its ranks load (`mncloud.train.reader`), and a whole-file
hash cannot check a range without reading the whole file. So each DCP shard file
(`__N_0.distcp`) gets a sidecar, `__N_0.distcp.chunks`, written beside it in the same save:
the xxh3_128 digest (16 bytes, canonical order) of every `CHUNK_SIZE` piece of the file, the
last piece possibly shorter. The sidecar is a file of the step like any other (the manifest
lists it with its size and whole-file hash, so it is verified whole when read), and the
manifest's `extra[CHUNKS_KEY]` says the chunk size. 64 KiB chunks: the sidecars add 1/4096 of
the shards' bytes, and a read of a range wider than its item costs at most one chunk at each
end.

Steps saved before sidecars existed have no `CHUNKS_KEY`: their ranges are read with the sizes
checked only (as a resume checked them before) or, with `verify_sha256`, whole files checked
against their whole-file hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

CHUNK_SIZE = 64 * 1024
"""Bytes per hashed chunk."""
SUFFIX = ".chunks"
"""A shard file's sidecar name is the shard's name plus this."""
CHUNKS_KEY = "chunk_hashes"
"""The manifest's `extra` key: {"size": CHUNK_SIZE, "algo": "xxh3_128", "suffix": SUFFIX}."""
DIGEST_BYTES = 16


def chunked(name: str) -> bool:
    """Does a file of this name get a sidecar of chunk hashes (a DCP shard file)?"""
    return name.endswith(".distcp")


def manifest_extra() -> dict[str, Any]:
    """What a manifest of a step with sidecars records under `CHUNKS_KEY`."""
    return {"size": CHUNK_SIZE, "algo": "xxh3_128", "suffix": SUFFIX}


def chunk_size_of(extra: dict[str, object]) -> int | None:
    """The chunk size a manifest's `extra` records (None: the step has no sidecars)."""
    info = extra.get(CHUNKS_KEY)
    if not isinstance(info, dict) or info.get("algo") != "xxh3_128":
        return None
    size = info.get("size")
    return size if isinstance(size, int) and size > 0 else None


class FileHasher:
    """The whole-file xxh3_128 of the bytes written through `update`, and, when `chunks` is
    set, the digest of every `chunk_size` piece of them (the sidecar's bytes)."""

    def __init__(self, *, chunks: bool, chunk_size: int = CHUNK_SIZE) -> None:
        self._whole = xxhash.xxh3_128()
        self._chunk = xxhash.xxh3_128() if chunks else None
        self._chunk_size = chunk_size
        self._fill = 0
        self._digests = bytearray()
        self.size = 0

    def update(self, data: Any) -> None:
        """Hash the next bytes of the file (xxhash releases the GIL on large buffers)."""
        view = memoryview(data).cast("B")
        self._whole.update(view)
        self.size += len(view)
        if self._chunk is None:
            return
        done = 0
        while done < len(view):
            take = min(len(view) - done, self._chunk_size - self._fill)
            self._chunk.update(view[done : done + take])
            self._fill += take
            done += take
            if self._fill == self._chunk_size:
                self._digests += self._chunk.digest()
                self._chunk.reset()
                self._fill = 0

    def hexdigest(self) -> str:
        """The whole file's hex digest so far."""
        return str(self._whole.hexdigest())

    def sidecar(self) -> bytes:
        """The chunk digests of everything written (the last, shorter chunk included)."""
        tail = self._chunk.digest() if self._chunk is not None and self._fill else b""
        return bytes(self._digests) + tail


@dataclass(frozen=True)
class ChunkDigests:
    """A shard file's sidecar, read: checks chunk-aligned ranges of that file."""

    name: str
    """The shard file's name (in messages)."""
    size: int
    """The shard file's size in bytes."""
    digests: bytes
    chunk_size: int = CHUNK_SIZE

    def problem(self) -> str | None:
        """Why the sidecar does not fit its file (a digest per chunk), or None."""
        want = -(-self.size // self.chunk_size) * DIGEST_BYTES
        if len(self.digests) != want:
            return f"{self.name}{SUFFIX} holds {len(self.digests)} bytes, {want} expected"
        return None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The chunk-aligned range of the file that covers bytes [start, end)."""
        first = start - start % self.chunk_size
        last = min(self.size, -(-end // self.chunk_size) * self.chunk_size)
        return first, last

    def check(self, start: int, data: bytes | bytearray | memoryview) -> str | None:
        """Why `data`, read from offset `start` (chunk-aligned; it ends on a chunk boundary or
        at the end of the file), differs from the sidecar, naming the file and the bytes; None
        when every chunk matches."""
        view = memoryview(data).cast("B")
        if start % self.chunk_size:
            raise ValueError(f"offset {start} is not on a chunk boundary")
        for at in range(0, len(view), self.chunk_size):
            piece = view[at : at + self.chunk_size]
            index = (start + at) // self.chunk_size
            want = self.digests[index * DIGEST_BYTES : (index + 1) * DIGEST_BYTES]
            if xxhash.xxh3_128_digest(piece) != want:
                lo = start + at
                return f"{self.name} bytes {lo}-{lo + len(piece) - 1} fail their xxh3_128"
        return None
