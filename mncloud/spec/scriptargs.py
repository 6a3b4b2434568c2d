"""The script's arguments as the run script's shell words: one path on every backend, and the
arguments of a resume only.

**`--ckpt-dir` in the arguments.** `--ckpt-dir /ckpt -- --output_dir /ckpt` must mean the same
on a cloud (where `/ckpt` is the node's folder) and on `--cloud local` (where each node's
folder is `…/nodes/node-N/ckpt-dir`). Every argument is shell-quoted, so the path is spliced
in as `"$MNCLOUD_CKPT_DIR"` wherever the `--ckpt-dir` path appears as a path of its own (itself
or a folder under it; `/ckpt2` is another path):

    --output_dir=/ckpt/run1   →   '--output_dir='"$MNCLOUD_CKPT_DIR"'/run1'

On a cloud `$MNCLOUD_CKPT_DIR` is `/ckpt`: the same word.

**`--resume-args`.** A script that resumes only when told (transformers' run_clm.py:
`--resume_from_checkpoint PATH`, a path that must exist; nanoGPT: `--init_from=resume`) gets
these words after its own on a node that starts with a committed unit in its `--ckpt-dir`
(`$MNCLOUD_RESUME_FROM`, that unit's path, set by the restore); `{ckpt}` is that path. With
none committed nothing is added, so the first attempt runs as written.
"""

from __future__ import annotations

import re
import shlex
import string

from mncloud.constants import CKPT_DIR_ENV, RESUME_FROM_ENV
from mncloud.errors import SpecError

PLACEHOLDERS = {"ckpt": f'"${RESUME_FROM_ENV}"'}
"""`--resume-args` placeholder → the shell word it becomes (the newest committed unit's path)."""


def resume_words(value: str | None, ckpt_dir: str | None) -> list[str]:
    """`--resume-args` split as a shell would; SpecError for a placeholder mncloud does not
    know, or without `--ckpt-dir` (what would name the checkpoint to resume from?)."""
    if value is None or not value.strip():
        return []
    flag = f"--resume-args {value!r}"
    if not ckpt_dir:
        raise SpecError(
            f"{flag} needs --ckpt-dir: the arguments are added when a node starts with a "
            "committed checkpoint in that folder"
        )
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise SpecError(f"{flag}: {err}; quote it as one shell string") from None
    known = ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)
    for word in words:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
        except ValueError as err:
            raise SpecError(f"{flag}: {err} in {word!r}; write a brace as {{{{ or }}}}") from None
        unknown = [f for f in fields if f not in PLACEHOLDERS]
        if unknown:
            raise SpecError(f"{flag}: unknown placeholder {{{unknown[0]}}}; mncloud knows {known}")
    return words


def resume_shell_words(words: list[str]) -> list[str]:
    """`--resume-args` words as shell words, each placeholder spliced in unquoted."""
    out = []
    for word in words:
        parts = []
        for text, field, _, _ in string.Formatter().parse(word):
            parts += [shlex.quote(text)] if text else []
            parts += [PLACEHOLDERS[field]] if field is not None else []
        out.append("".join(parts) or "''")
    return out


def path_in(ckpt_dir: str) -> re.Pattern[str]:
    """The `--ckpt-dir` path where it stands as a path of its own inside a word."""
    return re.compile(rf"(?<![\w.~/-]){re.escape(ckpt_dir.rstrip('/'))}(?=/|$|[^\w.-])")


def script_shell_words(args: list[str], ckpt_dir: str | None) -> list[str]:
    """The script's arguments as shell words, the `--ckpt-dir` path as `"$MNCLOUD_CKPT_DIR"`."""
    if not ckpt_dir:
        return [shlex.quote(arg) for arg in args]
    found, env = path_in(ckpt_dir), f'"${CKPT_DIR_ENV}"'
    out = []
    for arg in args:
        pieces = found.split(arg)
        out.append(env.join(shlex.quote(p) if p else "" for p in pieces) or "''")
    return out
