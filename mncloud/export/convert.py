"""DCP shards → one entry's state dict, one output shard at a time, written by safetensors or
`torch.save`. Reading is DCP's own (`_load_state_dict_from_keys` over a `FileSystemReader`:
every rank's chunks of a tensor are assembled by DCP); nothing here serialises tensors."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import get_element, set_element
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from mncloud.export.model import INDEX_FILE, ExportError, ExportFormat

LOAD_GROUP_BYTES = 256 * 2**20
"""The torch format reads the entry in groups of this many bytes (progress between them)."""


@dataclass(frozen=True)
class Item:
    """One value of the exported entry, as DCP's metadata describes it."""

    key: str
    """DCP's flattened key (`model.0.weight`)."""
    path: tuple[str | int, ...]
    """Where it sits in the saved state (`("model", "0.weight")`)."""
    name: str
    """Its name in the export (`0.weight`: the path below the entry)."""
    dtype: torch.dtype | None
    """None: not a tensor (saved by DCP as bytes)."""
    numel: int

    def nbytes(self, dtype: torch.dtype | None) -> int:
        """Bytes once written (converted to `dtype` if it is a floating-point tensor)."""
        if self.dtype is None:
            return 0
        return self.numel * _target(self.dtype, dtype).itemsize


def _target(saved: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and saved.is_floating_point else saved


def read_metadata(local: Path) -> Metadata:
    """DCP's metadata of the checkpoint in `local`."""
    return FileSystemReader(str(local)).read_metadata()


def entry_items(metadata: Metadata, entry: str, step: int) -> list[Item]:
    """The values under `entry` in the saved state, in the order they were saved; ExportError
    naming the entries there are when it has none."""
    planner = metadata.planner_data or {}
    items, entries = [], set()
    for key, meta in metadata.state_dict_metadata.items():
        path = tuple(planner.get(key) or key.split(".", 1))
        entries.add(str(path[0]))
        if str(path[0]) != entry or len(path) < 2:
            continue
        tensor = isinstance(meta, TensorStorageMetadata)
        items.append(
            Item(
                key=key,
                path=path,
                name=".".join(str(p) for p in path[1:]),
                dtype=meta.properties.dtype if tensor else None,
                numel=int(torch.Size(meta.size).numel()) if tensor else 0,
            )
        )
    if not items:
        held = ", ".join(sorted(entries)) or "nothing"
        raise ExportError(
            f"step {step} has no {entry!r} entry (it holds: {held}); name one with --only"
        )
    return items


def shard_files(metadata: Metadata, items: list[Item]) -> list[str]:
    """The DCP files (`__0_0.distcp`, …) that hold any chunk of `items`."""
    keys = {i.key for i in items}
    storage = metadata.storage_data or {}
    return sorted({info.relative_path for index, info in storage.items() if index.fqn in keys})


def plan_shards(items: list[Item], max_bytes: int, dtype: torch.dtype | None) -> list[list[Item]]:
    """Items cut into consecutive groups of at most `max_bytes` written (a bigger tensor
    alone in its group), as Hugging Face shards a checkpoint."""
    groups: list[list[Item]] = [[]]
    size = 0
    for item in items:
        n = item.nbytes(dtype)
        if groups[-1] and size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    return groups


def load_group(local: Path, items: list[Item], dtype: torch.dtype | None) -> dict[str, Any]:
    """`items` read by DCP from the shards in `local`, by export name, floating-point tensors
    converted to `dtype` (each old copy freed as the next one is made)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's note that it runs without a process group
        loaded = _load_state_dict_from_keys(
            {i.key for i in items}, storage_reader=FileSystemReader(str(local))
        )
    out: dict[str, Any] = {}
    for item in items:
        value = get_element(loaded, item.path)
        set_element(loaded, item.path, None)
        if isinstance(value, torch.Tensor) and item.dtype is not None:
            value = value.to(_target(item.dtype, dtype)).contiguous()
        out[item.name] = value
    return out


def shard_name(entry: str, index: int, count: int, fmt: ExportFormat) -> str:
    """`model.safetensors`, `model-00001-of-00003.safetensors` or `model.pt`."""
    if fmt is ExportFormat.TORCH:
        return f"{entry}.pt"
    if count == 1:
        return f"{entry}.safetensors"
    return f"{entry}-{index + 1:05d}-of-{count:05d}.safetensors"


def write(
    local: Path,
    items: list[Item],
    folder: Path,
    *,
    entry: str,
    fmt: ExportFormat,
    dtype: torch.dtype | None,
    max_bytes: int,
    progress: Callable[[int], None],
) -> Iterator[tuple[str, list[str]]]:
    """Write the export into `folder`; yields each file written with the tensor dtypes in it."""
    if fmt is ExportFormat.TORCH:
        yield from _write_torch(local, items, folder, entry, dtype, max_bytes, progress)
        return
    from safetensors.torch import save_file

    objects = [i.name for i in items if i.dtype is None]
    if objects:
        raise ExportError(
            f"{entry!r} holds values that are not tensors ({', '.join(objects[:3])}); "
            "safetensors stores tensors only: use --format torch"
        )
    groups = plan_shards(items, max_bytes, dtype)
    weight_map: dict[str, str] = {}
    for index, group in enumerate(groups):
        name = shard_name(entry, index, len(groups), fmt)
        tensors = load_group(local, group, dtype)
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        progress(sum(i.nbytes(dtype) for i in group))
        yield name, _dtype_names(tensors)
        del tensors
    if len(groups) > 1:
        index_name = INDEX_FILE if entry == "model" else f"{entry}.safetensors.index.json"
        total = sum(i.nbytes(dtype) for i in items)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / index_name).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        yield index_name, []


def _write_torch(
    local: Path,
    items: list[Item],
    folder: Path,
    entry: str,
    dtype: torch.dtype | None,
    max_bytes: int,
    progress: Callable[[int], None],
) -> Iterator[tuple[str, list[str]]]:
    """One `torch.save` file of the entry as it was saved (nested for an optimizer), read
    in groups so progress shows; the entry is in memory once."""
    state: dict[str, Any] = {}
    for group in plan_shards(items, min(max_bytes, LOAD_GROUP_BYTES), dtype):
        values = load_group(local, group, dtype)
        for item in group:
            set_element(state, item.path[1:], values.pop(item.name))
        progress(sum(i.nbytes(dtype) for i in group))
    name = shard_name(entry, 0, 1, ExportFormat.TORCH)
    dtypes = sorted({str(i.dtype if dtype is None else _target(i.dtype, dtype)).removeprefix(
        "torch.") for i in items if i.dtype is not None})  # fmt: skip
    torch.save(state, folder / name)
    yield name, dtypes


def _dtype_names(tensors: dict[str, Any]) -> list[str]:
    return sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values()})
