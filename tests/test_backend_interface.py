"""Callers never ask which backend runs a run (DESIGN.md): outside `mncloud/backends/`, no
module imports a concrete backend and no code compares a backend's name, but the few named
here. A new backend is then one package plus one registry line. An AST count, so it stays
held; each planted violation below must be caught."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from mncloud.backends.base import Backend, ControllerHost, Rehearsal
from mncloud.backends.local import LocalBackend
from mncloud.backends.skypilot import SkyPilotBackend

ROOT = Path(__file__).resolve().parent.parent / "mncloud"
CONCRETE = ("mncloud.backends.local", "mncloud.backends.skypilot")
NAMES = {"local", "skypilot"}

#: The modules outside backends/ allowed to import a concrete backend, and why.
IMPORTS_ALLOWED = {
    "mncloud.cli.chaos": "local by design: chaos on the local nodes",
}
#: Comparisons with a backend's name allowed outside backends/: cloud filters (a cloud, not
#: a backend, is compared), and the chaos command's refusal of cloud runs.
COMPARISONS_ALLOWED = {
    "mncloud.render": 1,  # the clouds a task is rendered for: `local` is none of them
    "mncloud.doctor.checks": 1,  # the clouds `doctor` checks credentials of
    "mncloud.launch": 1,  # `--cloud local` mixed with clouds is refused
    "mncloud.cli.chaos": 1,  # chaos refuses a run of another backend
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] != "backends":
            found[_module(path)] = ast.parse(path.read_text(), str(path))
    return found


def concrete_imports(tree: ast.Module) -> list[str]:
    """The concrete backend modules `tree` imports (at any depth, TYPE_CHECKING included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(CONCRETE)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            found += [n for n in [node.module, *names] if n.startswith(CONCRETE)][:1]
        elif isinstance(node, ast.Call) and node.args:  # importlib.import_module("mncloud…")
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and str(arg.value).startswith(CONCRETE):
                found.append(str(arg.value))
    return found


def name_comparisons(tree: ast.Module) -> int:
    """Comparisons (==, !=, in, not in) with the string "local" or "skypilot"."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            count += any(isinstance(o, ast.Constant) and o.value in NAMES for o in operands)
    return count


def test_only_the_named_modules_import_a_concrete_backend() -> None:
    importers = {name for name, tree in _sources().items() if concrete_imports(tree)}
    assert importers == set(IMPORTS_ALLOWED), (
        "outside backends/, go through backends.base.Backend and the registry; "
        f"new: {sorted(importers - set(IMPORTS_ALLOWED))}, "
        f"gone (drop them from IMPORTS_ALLOWED): {sorted(set(IMPORTS_ALLOWED) - importers)}"
    )


@pytest.mark.slow
def test_backend_names_are_compared_only_in_cloud_filters() -> None:
    counts = Counter({name: name_comparisons(tree) for name, tree in _sources().items()})
    found = {name: n for name, n in counts.items() if n}
    assert found == COMPARISONS_ALLOWED, (
        "ask the Backend (records_own_events, runs_here, ...) instead of comparing its name"
    )


@pytest.mark.parametrize(
    "planted",
    [
        "from mncloud.backends.local.state import load_state\n",
        "def f():\n    import mncloud.backends.skypilot.meta\n",
        "from mncloud.backends import local\n",
        "import importlib\nimportlib.import_module('mncloud.backends.skypilot')\n",
    ],
)
def test_a_planted_concrete_import_is_found(planted: str) -> None:
    assert concrete_imports(ast.parse(planted))


@pytest.mark.parametrize(
    "planted",
    [
        "if backend != 'local': pass\n",
        "x = cfg.backend == 'skypilot'\n",
        "y = 'local' in (a, b)\n",
    ],
)
def test_a_planted_name_comparison_is_found(planted: str) -> None:
    assert name_comparisons(ast.parse(planted)) == 1


def test_both_backends_implement_the_whole_interface() -> None:
    """Every member `Backend` declares, on each engine (a Protocol checks only methods)."""
    members = {n for n in vars(Backend) if not n.startswith("_")} | set(Backend.__annotations__)
    for engine in (LocalBackend(), SkyPilotBackend()):
        assert isinstance(engine, Backend)
        missing = {m for m in members if not hasattr(engine, m)}
        assert not missing, f"{engine.name} lacks {sorted(missing)}"
    assert LocalBackend.records_own_events and LocalBackend.runs_here
    assert not SkyPilotBackend.records_own_events and not SkyPilotBackend.runs_here


def test_each_engine_refuses_the_member_that_is_not_its_own() -> None:
    """A rehearsal's controller is a process here, a cloud run is no rehearsal: one line each."""
    from mncloud.errors import BackendError

    with pytest.raises(BackendError, match="process on this machine"):
        LocalBackend().controller_host()
    with pytest.raises(BackendError, match="not a rehearsal"):
        SkyPilotBackend().rehearsal()
    host, members = SkyPilotBackend().controller_host(), _members(ControllerHost)
    assert not {m for m in members if not callable(getattr(host, m, None))}
    rehearsal, members = LocalBackend().rehearsal(), _members(Rehearsal)
    assert not {m for m in members if not callable(getattr(rehearsal, m, None))}


def _members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")}
