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

Under pytest-xdist each worker is its own process: the finals are also kept as JSON files in a
folder of the test run (`PYTEST_XDIST_TESTRUNUID`) under a file lock, so a configuration is run
once per session whichever worker asks first, and a worker asking meanwhile waits for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock

from mncloud.backends.base import RunState
from mncloud.backends.local.figures import read_final
from tests.test_local import run_log, up, wait_final

_finals: dict[tuple[str, ...], dict[str, Any]] = {}


def reference_final(script: Path, flags: list[str], train: list[str]) -> dict[str, Any]:
    """The final record (steps, loss, `weights_sha256`) of `script` run uninterrupted."""
    train = _without_sleep(train)
    key = reference_key(script, flags, train)
    if key not in _finals:
        path = shared_file(key)
        if path is None:
            _finals[key] = _run(script, flags, train)
        else:
            with FileLock(str(path.with_suffix(".lock"))):
                if not path.exists():
                    path.write_text(json.dumps(_run(script, flags, train)))
                _finals[key] = json.loads(path.read_text())
    return _finals[key]


def reference_key(script: Path, flags: list[str], train: list[str]) -> tuple[str, ...]:
    """What a reference run is known by: the script, its flags and its arguments less the
    sleep."""
    return (str(script), *flags, "--", *_without_sleep(train))


def _run(script: Path, flags: list[str], train: list[str]) -> dict[str, Any]:
    name = f"ref-{len(_finals)}"
    up(name, script, *flags, "--no-preflight", script_args=train)
    state = wait_final(name)
    assert state.state is RunState.SUCCEEDED, run_log(name)
    final = read_final(state.ckpt_uri)
    assert final is not None, f"{name} wrote no final.json"
    return final


def shared_file(key: tuple[str, ...]) -> Path | None:
    """Where the xdist workers of this test run keep the final of `key` (None outside xdist)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    folder = Path(tempfile.gettempdir()) / f"mncloud-references-{run}"
    folder.mkdir(exist_ok=True)
    return folder / f"{hashlib.sha256(chr(0).join(key).encode()).hexdigest()[:16]}.json"


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
