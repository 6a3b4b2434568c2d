"""Uninterrupted reference runs, one per configuration per test session.

A test that proves a run interrupted (preempted, switched, resumed) ends on the weights of an
uninterrupted run compares it with `reference_final(script, flags, train)`: the `final.json` of
a local run of `script` with `flags` (nodes and GPUs: what the weights depend on) and the
script's `train` arguments. The first test that asks runs it (after its own run, so the
reference puts no load on that run's timing); later tests with the same configuration reuse
its result, which the same seeds make bit for bit the same.
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
    key = (str(script), *flags, "--", *train)
    if key not in _finals:
        name = f"ref-{len(_finals)}"
        up(name, script, *flags, script_args=train)
        state = wait_final(name)
        assert state.state is RunState.SUCCEEDED, run_log(name)
        final = read_final(state.ckpt_uri)
        assert final is not None, f"{name} wrote no final.json"
        _finals[key] = final
    return _finals[key]
