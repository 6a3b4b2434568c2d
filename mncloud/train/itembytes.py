"""A saved tensor read in place from the bytes a resume fetched: no copy before its target's.

DCP writes each tensor item with `torch.save`: a zip archive (stored, not compressed) whose
`data.pkl` describes the tensor and whose `data/<key>` record holds its storage's bytes.
`torch.load` of an item copies those bytes twice before DCP copies them into the model (into a
buffer for the archive, then into a new storage); at users' sizes that was half of a resume's
time. `tensor_in_place` reads the archive's directory and its small `data.pkl` (Python's own
`zipfile` and a restricted `pickle.Unpickler` that builds nothing), then views the storage's
bytes where they lie (`torch.frombuffer`): the only copy left is DCP's into the target.

The bytes were checked against the chunk hashes before this runs. Anything this reader does not
recognise (another layout, a big-endian archive, a compressed record, several storages) returns
None, and the caller falls back to `torch.load` over the same bytes, without the first copy.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zipfile
from dataclasses import dataclass
from typing import Any

import torch

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
"""A zip local file header (30 bytes): signature ... name length, extra length."""


class ViewFile(io.RawIOBase):
    """A read-only, seekable binary file over a memoryview (nothing copied up front)."""

    def __init__(self, view: Any) -> None:
        super().__init__()
        self._view = memoryview(view).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: torch.dtype
    numel: int


@dataclass(frozen=True)
class _Spec:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _dtype_of(storage_name: str) -> torch.dtype:
    """The dtype of a pickled legacy storage class (`FloatStorage` → torch.float32)."""
    from torch.storage import _get_dtype_from_pickle_storage_type

    return _get_dtype_from_pickle_storage_type(storage_name)


def _rebuild(storage: _Storage, offset: int, size: Any, stride: Any, *_rest: Any) -> _Spec:
    return _Spec(storage, int(offset), tuple(size), tuple(stride))


class _Describe(pickle.Unpickler):
    """Reads a one-tensor `data.pkl` into a `_Spec`; refuses anything else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("torch._utils", "_rebuild_parameter"):  # a Parameter: its data
            return lambda data, *_rest: data
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and name.endswith("Storage"):
            return _dtype_of(name)  # a legacy typed-storage class's name: its dtype
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain tensor's")

    def persistent_load(self, pid: Any) -> _Storage:
        kind, dtype, key, _location, numel = pid
        if kind != "storage" or not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"persistent id {kind!r}")
        return _Storage(str(key), dtype, int(numel))


def _record(view: memoryview, info: zipfile.ZipInfo) -> memoryview | None:
    """A stored record's bytes where they lie (read past zipfile: `torch.save` may leave the
    CRC out, which zipfile's reader would refuse); None when its local header is not one."""
    head = _LOCAL_HEADER.unpack_from(view, info.header_offset)
    start = info.header_offset + _LOCAL_HEADER.size + head[9] + head[10]
    if head[0] != b"PK\x03\x04" or info.compress_type != zipfile.ZIP_STORED:
        return None
    if start + info.file_size > len(view):
        return None
    return view[start : start + info.file_size]


def tensor_in_place(data: Any) -> torch.Tensor | None:
    """The tensor `torch.save` wrote into `data`, viewing `data`'s bytes; None when the
    archive is not one this reader knows (the caller then uses `torch.load`)."""
    if sys.byteorder != "little":
        return None
    view = memoryview(data).cast("B")
    try:
        with zipfile.ZipFile(ViewFile(view)) as archive:  # its directory only
            infos = {i.filename: i for i in archive.infolist()}
        prefix = next(iter(infos)).split("/", 1)[0] + "/"
        order = _record(view, infos[prefix + "byteorder"])
        pickled = _record(view, infos[prefix + "data.pkl"])
        if order is None or bytes(order).strip() != b"little" or pickled is None:
            return None
        spec = _Describe(io.BytesIO(pickled)).load()
        if not isinstance(spec, _Spec):
            return None
        storage = _record(view, infos[f"{prefix}data/{spec.storage.key}"])
    except (KeyError, ValueError, IndexError, TypeError, AttributeError, StopIteration,
            struct.error, zipfile.BadZipFile, pickle.UnpicklingError, EOFError):  # fmt: skip
        return None
    itemsize = torch.empty((), dtype=spec.storage.dtype).element_size()
    if storage is None or len(storage) != spec.storage.numel * itemsize:
        return None
    if spec.storage.numel == 0:
        return torch.empty(spec.size, dtype=spec.storage.dtype)
    flat = torch.frombuffer(storage, dtype=spec.storage.dtype)
    return flat.as_strided(spec.size, spec.stride, spec.offset)
