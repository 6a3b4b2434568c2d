"""A framework's checkpoints in a `--ckpt-dir` folder, by name: which one is the newest.

Each framework names what it saves by its step, and resumes from the newest by that name:

    checkpoint-40/                  Hugging Face Trainer (a folder; `tmp-checkpoint-40/` while
                                    it is written, then renamed)
    step-40/                        torchtitan (a DCP folder)
    epoch=4-step=40.ckpt, last.ckpt Lightning (files; `last.ckpt` is a copy or a link)

`newest(keys)` reads a listing of the folder (keys relative to it) and names the entry with the
highest step. Torch-free, no I/O: `status`, the run's summary and the goodput ledger use it.

**What a restore brings** (`folderrestore.py`). The Trainer and torchtitan resume from their
newest folder and rotate oldest first by step (`save_total_limit`, `keep_latest_k`): `rotated`
names such a folder's family and step, and only the newest (and the Trainer's best, named in
its `trainer_state.json`: `named_best`) needs to be on the node. Lightning's `.ckpt` files and
folders are not rotated by step: it resumes from `last.ckpt`, and its `ModelCheckpoint` keeps
the top-k by a metric it records inside them, so every one of them is restored, as is any
other name. When the bucket's `last.ckpt` is refused (it fails its record), the newest
`epoch=…-step=….ckpt` restored is copied under its name (`LIGHTNING_LAST`): Lightning looks
for no other file when it resumes from "last".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import NamedTuple

_ROTATED = re.compile(r"^(checkpoint|step)-(\d+)$")
TRAINER_STATE = "trainer_state.json"
"""In a Trainer's `checkpoint-N/`: its state, `best_model_checkpoint` among it."""
_STEP = re.compile(r"^(?:checkpoint-|step-)(\d+)$|(?:^|-)step=(\d+)(?:-v\d+)?\.ckpt$")
LIGHTNING_LAST = re.compile(r"^last(?:-v?\d+)?\.ckpt$")
"""Lightning's `last.ckpt` (`last-v1.ckpt` with its version counter): what
`fit(ckpt_path="last")` looks for (`ModelCheckpoint._find_last_checkpoints`), and only that:
without one it starts afresh, whatever `epoch=…-step=….ckpt` the folder holds."""


class Newest(NamedTuple):
    """The newest checkpoint entry of a `--ckpt-dir` folder."""

    name: str
    """Its top-level name (`checkpoint-40`, `epoch=4-step=40.ckpt`)."""
    step: int


def entry_step(name: str) -> int | None:
    """The step a top-level entry's name carries (`checkpoint-40` → 40), or None."""
    match = _STEP.search(name)
    if match is None:
        return None
    return int(match[1] or match[2])


def newest(keys: Iterable[str]) -> Newest | None:
    """The top-level entry with the highest step among `keys` (relative to the folder)."""
    best: Newest | None = None
    for key in keys:
        name = key.strip("/").split("/", 1)[0]
        step = entry_step(name)
        if step is not None and (best is None or step > best.step):
            best = Newest(name, step)
    return best


class Rotated(NamedTuple):
    """A checkpoint folder its framework resumes from when newest and deletes oldest first."""

    family: str
    """`checkpoint` (the Hugging Face Trainer) or `step` (torchtitan)."""
    step: int


def rotated(name: str) -> Rotated | None:
    """`checkpoint-40` → Rotated("checkpoint", 40); None for a name no framework rotates by
    step (Lightning's `.ckpt`, `final`, a file's name: the caller knows it is a folder)."""
    match = _ROTATED.match(name)
    return Rotated(match[1], int(match[2])) if match else None


def named_best(trainer_state: bytes | str) -> str | None:
    """The top-level name of the Trainer's best checkpoint in a `trainer_state.json`
    (`best_model_checkpoint`, a path such as `/ckpt/checkpoint-20`), or None."""
    try:
        best = json.loads(trainer_state).get("best_model_checkpoint")
    except (ValueError, AttributeError):
        return None
    if not isinstance(best, str) or not best.strip("/"):
        return None
    return best.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
