"""The script's final result beside its checkpoints (`final.json`: steps, the sha256 of its
weights), written by `mncloud.train.Progress`, read by `status`, `runs` and the local
reference run, whichever backend ran it.

A framework's script under `--ckpt-dir` writes no `final.json`: `ckpt_dir_final` gives the
same figures from its newest committed unit (`folders.newest_committed`, as the summary,
`status` and `ckpt ls` name it), its weights file checked against its markers first:

    checkpoint-80/  (the Trainer)   model.safetensors: its tensors, by name
    epoch=9-step=40.ckpt  (Lightning)   its `state_dict`'s tensors, by name

The sha256 covers each tensor's name, dtype, shape and bytes in name order (not the file's
bytes: Lightning's file also holds the node's own paths), so the run and its uninterrupted
reference compare equal when their weights are. A torch file is read with `torch.load(...,
weights_only=True)` (torch imported then); safetensors with `safetensors.deserialize`.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import xxhash

from mncloud import layout
from mncloud.storage.buckets import ObjectNotFoundError
from mncloud.storage.factory import open_bucket
from mncloud.storage.folders import FILE_ENTRY, judge, newest_committed
from mncloud.storage.url import join_key

FINAL_FILE = "final.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt")
"""In a committed checkpoint folder, the file that holds the model's weights (the first found)."""


def read_final(ckpt_uri: str) -> dict[str, Any] | None:
    """The script's final.json beside its checkpoints, or None."""
    bucket, prefix = open_bucket(ckpt_uri, retry_seconds=5)
    try:
        return dict(json.loads(bucket.get_bytes(join_key(prefix, FINAL_FILE))))
    except ObjectNotFoundError:
        return None


def ckpt_dir_final(ckpt_uri: str) -> dict[str, Any] | None:
    """A `--ckpt-dir` run's final figures from its newest committed unit: `steps`,
    `weights_sha256` and `weights_file` (its path in the folder); None when no committed unit
    is named by a step, none of its files holds weights this reads, or the file fails its
    markers' hash."""
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(ckpt_uri), retry_seconds=5)
    units = judge(bucket, prefix)
    found = newest_committed(units)
    if found is None:
        return None
    unit = next(v for v in units if v.name == found.name)
    rel = next((f for f in WEIGHT_FILES if f in unit.files), None) if unit.folder else FILE_ENTRY
    if rel is None:
        return None
    path = f"{unit.name}/{rel}" if rel else unit.name
    data = bucket.get_bytes(join_key(prefix, path))
    hashes = unit.files[rel][1]
    if hashes and xxhash.xxh3_128_hexdigest(data) not in hashes:
        return None
    digest = weights_sha256(data, path)
    if digest is None:
        return None
    return {"steps": found.step, "weights_sha256": digest, "weights_file": path}


def weights_sha256(data: bytes, name: str) -> str | None:
    """The sha256 of the tensors a safetensors file or a torch file (a Lightning checkpoint's
    `state_dict`, or a plain state dict) holds (module docstring); None for anything else."""
    digest = hashlib.sha256()
    if name.endswith(".safetensors"):
        from safetensors import deserialize

        for key, t in sorted(deserialize(data)):
            digest.update(f"{key}\0{t['dtype']}\0{list(t['shape'])}\0".encode() + bytes(t["data"]))
        return digest.hexdigest()
    try:
        import torch

        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # not a torch file, or one weights_only refuses: no figure
        return None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        return None
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        return None
    for key, t in sorted(tensors.items()):
        flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(f"{key}\0{t.dtype}\0{list(t.shape)}\0".encode() + flat.numpy().tobytes())
    return digest.hexdigest()
