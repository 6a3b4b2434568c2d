"""Uninterrupted reference runs, one per configuration per test session.

A test that proves a run interrupted (preempted, switched, resumed) ends on the weights of an
uninterrupted run compares it with `reference_final(script, flags, train)`: the `final.json` of
a local run of `script` with `flags` (nodes and GPUs: what the weights depend on) and the
script's `train` arguments. The first test that asks runs it (after its own run, so the
reference puts no load on that run's timing); later tests with the same configuration reuse
its result, which the same seeds make bit for bit the same. The examples' `--compute-ms`
(a sleep standing for GPU time after each backward pass; no weight depends on it) is left
out of the reference run: the same weights, without the sleep (30 s of 600 steps × 50 ms).
So is the nodes' preflight (`--no-preflight`: it runs before torchrun, a few seconds a
launch on 2 cores): the interrupted runs the reference is compared with keep theirs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mncloud.backends.base import RunState
from mncloud.backends.local.figures import read_final
from tests.test_local import run_log, up, wait_final

_finals: dict[tuple[str, ...], dict[str, Any]] = {}


def reference_final(script: Path, flags: list[str], train: list[str]) -> dict[str, Any]:
    """The final record (steps, loss, `weights_sha256`) of `script` run uninterrupted."""
    train = _without_sleep(train)
    key = (str(script), *flags, "--", *train)
    if key not in _finals:
        name = f"ref-{len(_finals)}"
        up(name, script, *flags, "--no-preflight", script_args=train)
        state = wait_final(name)
        assert state.state is RunState.SUCCEEDED, run_log(name)
        final = read_final(state.ckpt_uri)
        assert final is not None, f"{name} wrote no final.json"
        _finals[key] = final
    return _finals[key]


_files: dict[tuple[str, ...], bytes] = {}


def reference_ckpt_dir_file(script: Path, flags: list[str], train: list[str], path: str) -> bytes:
    """The bytes of `path` in the `--ckpt-dir` folder (as the bucket holds it) of `script` run
    uninterrupted: for a framework's script, which writes no final.json (`flags` name the
    `--ckpt-dir`)."""
    from mncloud import layout
    from mncloud.storage import join_key, open_bucket

    train = _without_sleep(train)
    key = (str(script), *flags, "--", *train, "::", path)
    if key not in _files:
        name = f"ref-file-{len(_files)}"
        up(name, script, *flags, "--no-preflight", script_args=train)
        state = wait_final(name, timeout=400)
        assert state.state is RunState.SUCCEEDED, run_log(name)
        bucket, prefix = open_bucket(layout.ckpt_dir_uri(state.ckpt_uri))
        _files[key] = bucket.get_bytes(join_key(prefix, path))
    return _files[key]


def _without_sleep(train: list[str]) -> list[str]:
    """`train` less its `--compute-ms N` (an idle wait in the examples' training loop)."""
    out, args = [], iter(train)
    for arg in args:
        if arg == "--compute-ms":
            next(args, None)
        elif not arg.startswith("--compute-ms="):
            out.append(arg)
    return out
