"""Uninterrupted reference runs, one per configuration per test session.

A test that proves a run interrupted (preempted, switched, resumed) ends on the weights of an
uninterrupted run compares it with `reference_final(script, flags, train)`: the `final.json` of
a local run of `script` with `flags` (nodes and GPUs: what the weights depend on) and the
script's `train` arguments. The first test that asks runs it (after its own run, so the
reference puts no load on that run's timing); later tests with the same configuration reuse
its result, which the same seeds make bit for bit the same. A test whose run's timing cannot
suffer from a run beside it (a deadline rehearsal paced by its training, a run already
preempted) starts the reference with its own run instead, `start_reference(...)`, and waits
for it with the call that returns: the two overlap. The examples' `--compute-ms`
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
import itertools
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from mncloud.backends.base import RunState
from mncloud.backends.local.figures import read_final
from mncloud.backends.local.state import LocalState, load_state
from mncloud.layout import run_dir
from tests.test_local import up, wait_until

_finals: dict[tuple[str, ...], dict[str, Any]] = {}
_running: dict[tuple[str, ...], Path] = {}
"""The run folders of references started in this process and not yet waited for."""
_names = itertools.count()


def reference_final(script: Path, flags: list[str], train: list[str]) -> dict[str, Any]:
    """The final record (steps, loss, `weights_sha256`) of `script` run uninterrupted."""
    return start_reference(script, flags, train)()


def start_reference(
    script: Path, flags: list[str], train: list[str]
) -> Callable[[], dict[str, Any]]:
    """Start the reference run of this configuration now, unless this session has one (run,
    or running: under xdist perhaps in another worker); the call returned waits for its final.
    The run goes on by itself (a detached local run): a test that fails before it waits leaves
    it to end, and a worker that waits on it meanwhile still gets its final."""
    train = _without_sleep(train)
    key = reference_key(script, flags, train)
    if key in _finals:
        return lambda: _finals[key]
    path = shared_file(key)
    if path is None:
        if key not in _running:
            _running[key] = _start(script, flags, train)
        folder = _running[key]
    else:
        started = path.with_suffix(".started")
        with FileLock(str(path.with_suffix(".lock"))):
            if path.exists():
                _finals[key] = json.loads(path.read_text())
                return lambda: _finals[key]
            if not started.exists():
                started.write_text(str(_start(script, flags, train)))
            folder = Path(started.read_text())

    def final() -> dict[str, Any]:
        if key not in _finals:
            _finals[key] = _wait(folder)
            if path is not None:
                with FileLock(str(path.with_suffix(".lock"))):
                    if not path.exists():
                        path.write_text(json.dumps(_finals[key]))
        return _finals[key]

    return final


def reference_key(script: Path, flags: list[str], train: list[str]) -> tuple[str, ...]:
    """What a reference run is known by: the script, its flags and its arguments less the
    sleep."""
    return (str(script), *flags, "--", *_without_sleep(train))


def _start(script: Path, flags: list[str], train: list[str]) -> Path:
    """Launch the reference run (detached: `up` returns once it started); its run folder."""
    name = f"ref-{next(_names)}"
    up(name, script, *flags, "--no-preflight", script_args=train)
    return run_dir(name)


def _wait_state(folder: Path, timeout: float = 400) -> LocalState:
    """The state of the reference run in `folder` once it ended, succeeded."""
    state = wait_until(lambda: (s := load_state(folder)).state.is_final and s, timeout,
                       f"the reference run in {folder}")  # fmt: skip
    assert isinstance(state, LocalState)
    log = (folder / "run.log").read_text() if (folder / "run.log").exists() else ""
    assert state.state is RunState.SUCCEEDED, log
    return state


def _wait(folder: Path) -> dict[str, Any]:
    """The final record of the reference run in `folder`, once it ended."""
    final = read_final(_wait_state(folder).ckpt_uri)
    assert final is not None, f"the reference run in {folder} wrote no final.json"
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
    return start_reference_ckpt_dir_file(script, flags, train, path)()


def start_reference_ckpt_dir_file(
    script: Path, flags: list[str], train: list[str], path: str
) -> Callable[[], bytes]:
    """As `reference_ckpt_dir_file`, the run started now (beside a run already preempted); the
    call returned waits for it."""
    from mncloud import layout
    from mncloud.storage import join_key, open_bucket

    train = _without_sleep(train)
    key = (str(script), *flags, "--", *train, "::", path)
    if key in _files:
        return lambda: _files[key]
    folder = _start(script, flags, train)

    def file() -> bytes:
        if key not in _files:
            state = _wait_state(folder)
            bucket, prefix = open_bucket(layout.ckpt_dir_uri(state.ckpt_uri))
            _files[key] = bucket.get_bytes(join_key(prefix, path))
        return _files[key]

    return file


def _without_sleep(train: list[str]) -> list[str]:
    """`train` less its `--compute-ms N` (an idle wait in the examples' training loop)."""
    out, args = [], iter(train)
    for arg in args:
        if arg == "--compute-ms":
            next(args, None)
        elif not arg.startswith("--compute-ms="):
            out.append(arg)
    return out
