"""The floor plan holds: no import circle in `mncloud/` and each stage imports only earlier ones.

Every import counts, inside functions and under `TYPE_CHECKING` too. `from P import n` is an
import of the submodule `P.n` when there is one, else of P's `__init__`; importing a module of
another package also runs that package's `__init__`, so it counts as importing that too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Stages, earliest first: a module imports modules of its own stage and earlier ones only; the
#: longest prefix names a module's stage. The request's way, spec → plan → render → launch, with
#: three facts of the code: the catalog comes before the vocabulary (`spec` checks GPU and cloud
#: names against SkyPilot's facts); the backends' interface before `launch` (the spine calls
#: it); the controller after `launch` (it launches again). Storage, export, and what a training
#: rank imports are the ground floor; `mncloud.records` is a lazy package whose light modules
#: (`redact`, `telemetry`) sit there, its record-keeping modules after the task they record.
STAGES: list[tuple[str, ...]] = [
    ("mncloud", "mncloud.errors", "mncloud.constants", "mncloud.layout"),
    ("mncloud.catalog",),
    ("mncloud.storage", "mncloud.export", "mncloud.records"),
    ("mncloud.train", "mncloud.doctor"),
    ("mncloud.spec",),
    ("mncloud.request", "mncloud.plan"),
    ("mncloud.deadline", "mncloud.render"),
    tuple(
        f"mncloud.records.{m}" for m in ("model", "store", "lineage", "ledger", "goodput", "rerun")
    ),
    ("mncloud.backends",),
    ("mncloud.launch",),
    ("mncloud.control",),
    ("mncloud.operate",),
    ("mncloud.ui", "mncloud.cli", "mncloud.__main__"),
]


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root` by dotted name (a package by its own name)."""
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of `package` it imports (see the module docstring)."""
    mods = modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]  # fmt: skip
            for target in targets:
                parts = target.split(".")
                for i in range(1, len(parts)):  # the packages it runs on the way
                    pkg = ".".join(parts[:i])
                    if pkg in mods and not (name == pkg or name.startswith(pkg + ".")):
                        graph[name].add(pkg)
                if target in mods and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle per knot of modules that reach each other, as a path that ends where
    it starts: the shortest one through the knot's first module."""
    found = []
    for first in sorted(graph):
        paths = {nxt: [first, nxt] for nxt in sorted(graph[first])}
        queue = list(paths)
        while queue and first not in paths:
            node = queue.pop(0)
            for nxt in sorted(graph[node]):
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    queue.append(nxt)
        if first in paths and not any(first in circle for circle in found):
            found.append(paths[first])
    return found


def stage_of(module: str, stages: list[tuple[str, ...]]) -> int:
    """The stage whose longest entry names `module` or a package holding it, -1 for none (the
    root package names only itself: a new top-level module needs a stage of its own)."""
    best, index = "", -1
    for i, names in enumerate(stages):
        for prefix in names:
            inside = "." in prefix and module.startswith(prefix + ".")
            if (module == prefix or inside) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def order_violations(graph: dict[str, set[str]], stages: list[tuple[str, ...]]) -> list[str]:
    """Imports that reach a later stage, as 'a (stage i) imports b (stage j)'."""
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            i, j = stage_of(name, stages), stage_of(target, stages)
            if j > i:
                out.append(f"{name} (stage {i}) imports {target} (stage {j})")
    return out


def test_no_import_circle() -> None:
    found = circles(import_graph(ROOT, "mncloud"))
    assert not found, "import circles:\n" + "\n".join(" → ".join(c) for c in found)


def test_every_module_has_a_stage_and_the_order_holds() -> None:
    graph = import_graph(ROOT, "mncloud")
    assert [m for m in sorted(graph) if stage_of(m, STAGES) < 0] == []
    assert order_violations(graph, STAGES) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A tiny package: `pkg.a` imports `pkg.b`; `pkg.low` is a stage below `pkg.a`."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    (pkg / "low.py").write_text("")
    return tmp_path


def test_the_checks_catch_a_planted_circle_and_a_planted_inversion(planted: Path) -> None:
    stages = [("pkg.low", "pkg.b"), ("pkg", "pkg.a")]
    assert circles(import_graph(planted, "pkg")) == []
    assert order_violations(import_graph(planted, "pkg"), stages) == []
    (planted / "pkg" / "b.py").write_text("def f():\n    from pkg.a import g\n")
    assert circles(import_graph(planted, "pkg")) == [["pkg.a", "pkg.b", "pkg.a"]]
    (planted / "pkg" / "low.py").write_text("if False:\n    import pkg.a\n")
    assert "pkg.low (stage 0) imports pkg.a (stage 1)" in order_violations(
        import_graph(planted, "pkg"), stages
    )


def test_a_submodule_importing_its_package_init_that_imports_it_back_is_a_circle(
    planted: Path,
) -> None:
    (planted / "pkg" / "__init__.py").write_text("from pkg.b import f\nX = 1\n")
    assert circles(import_graph(planted, "pkg")) == []
    (planted / "pkg" / "b.py").write_text("from pkg import X\n")
    assert circles(import_graph(planted, "pkg")) == [["pkg", "pkg.b", "pkg"]]
