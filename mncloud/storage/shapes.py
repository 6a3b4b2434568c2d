"""Does a checkpoint fit the model a script builds? Parameter names and global shapes compared.

A checkpoint's manifest records each model tensor's name and global shape (`extra.shapes`,
`{"model.blocks.0.qkv.weight": [192, 64], ...}`: the state key, then the canonical name;
sharded tensors by their whole shape). A profile of the script records the same of the model
it builds. `up --resume` compares the two before it launches; `CheckpointManager.load`
compares the manifest with the live model before DCP reads a byte. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Shapes = Mapping[str, Sequence[int]]

SHAPES_KEY = "shapes"
"""The manifest's `extra` key of the model tensors' shapes."""


def _shown(shape: Sequence[int]) -> str:
    return "×".join(str(n) for n in shape) or "a scalar"


def shape_mismatch(saved: Shapes, built: Shapes, *, step: int, where: str) -> str | None:
    """One line naming the first difference between a checkpoint's model tensors (`saved`,
    step `step`) and those `where` builds ("this script"), or None when they agree."""
    differ = next(
        (k for k in sorted(built) if k in saved and list(saved[k]) != list(built[k])), None
    )
    if differ is not None:
        what = (f"{differ} is {_shown(saved[differ])} there, {_shown(built[differ])} in "
                f"{where}")  # fmt: skip
    elif missing := sorted(set(built) - set(saved)):
        what = f"{missing[0]} of {where} is not in it"
    elif extra := sorted(set(saved) - set(built)):
        what = f"its {extra[0]} is not in {where}"
    else:
        return None
    return (
        f"checkpoint step {step} was written by a different model: {what}; resume with the "
        "script and arguments that wrote it, or start anew (--replace, or another --name)"
    )
