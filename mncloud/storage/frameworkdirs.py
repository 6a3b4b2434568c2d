"""A framework's checkpoints in a `--ckpt-dir` folder, by name: which one is the newest.

Each framework names what it saves by its step, and resumes from the newest by that name:

    checkpoint-40/                  Hugging Face Trainer (a folder; `tmp-checkpoint-40/` while
                                    it is written, then renamed)
    step-40/                        torchtitan (a DCP folder)
    epoch=4-step=40.ckpt, last.ckpt Lightning (files; `last.ckpt` is a copy or a link)

`newest(keys)` reads a listing of the folder (keys relative to it) and names the entry with the
highest step. Torch-free, no I/O: `status`, the run's summary and the goodput ledger use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

_STEP = re.compile(r"^(?:checkpoint-|step-)(\d+)$|(?:^|-)step=(\d+)(?:-v\d+)?\.ckpt$")


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
