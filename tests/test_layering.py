"""The floor plan holds: no import circle in `mncloud/`, every module in a room of `ROOMS`, and
each room importing only itself and the rooms listed before it.

What counts as an import (an edge): every `import`, inside functions and under `TYPE_CHECKING`
too. `from P import n` is an import of the submodule `P.n` when there is one, else of P's
`__init__`, and then `n` must be a name P binds (no lazy facade: a package `__getattr__` that
loads a module on first use would hide its edges, so it is refused, and nothing is importable
from a package that its `__init__` does not bind). Importing a module of another package also
runs that package's `__init__`, so it counts as importing that too; a submodule used as an
attribute of an imported package (`import p` … `p.sub.f()`) is an edge. `importlib.import_module`
and `__import__` with a literal name are edges; with a name built at run time they are refused
outside `DYNAMIC_IMPORTS`, whose modules' strings naming modules of the tree (`"mncloud.x"`,
`"mncloud.x:Class"`: the backends' registry table) are their edges. Any other such string is
refused outside `MODULE_STRINGS`, short and each entry with its reason (a `python -m` entry
point, a package's data file: not imported by the module that names it). Logger names (the
first argument of `getLogger`) are not modules and are not looked at.

Why `mncloud.telemetry` is its own package on the ground floor: every training rank writes the
telemetry segments (`train.steptime`, `doctor.bandwidth`) and every reader needs them (the local
supervisor, `status`, the web view); it is torch-free and imports only the ground floor and
storage. Run records (`mncloud.records`) keep what a run was and cost; they are written by the
launch and read the telemetry, so they sit above `render` and `mncloud.telemetry` far below.
`mncloud.redact` (what a credential looks like) is a ground-floor module: `request` refuses a
credential-shaped `--env` value with it and `records` scrubs with it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The rooms, earliest first: (a package or module, its modules). A module imports modules of
#: its own room and of rooms listed before it only; a room's modules are named one by one
#: (a package's `__init__` is the room itself; a subpackage is a room of its own), so a new
#: module is a decision: the test names a module no room holds. The request's way,
#: spec → plan → render → launch, with three facts of the code: the catalog comes before the
#: vocabulary (`spec` checks GPU and cloud names against SkyPilot's facts); the backends'
#: interface before `launch` (the spine calls it); the controller after `launch` (it launches
#: again). Storage, the ranks' telemetry, export, and what a training rank imports are the
#: ground floor; so is `options` (the job options' plain data, vocabulary like `spec`),
#: because `--help` reads it without pydantic. The backends' registry comes after the engines
#: it names (its table's dotted paths are its edges); nothing in `backends/` imports it.
ROOMS: list[tuple[str, str]] = [
    ("mncloud", ""),
    ("mncloud.errors", ""),
    ("mncloud.constants", ""),
    ("mncloud.options", ""),
    ("mncloud.layout", ""),
    ("mncloud.redact", ""),
    ("mncloud.catalog", "cache clouds gpus index skyconfig"),
    ("mncloud.storage", "buckets checkpoints factory gcs lighthouse names prepare retry s3 "
                        "stoprequest url final shapes folders foldersync frameworkdirs "
                        "folderrestore transfer chunks rangeread"),
    ("mncloud.telemetry", "segments rollup series seriestail steps curves"),
    ("mncloud.export", "convert model run source target"),
    ("mncloud.train", "ckpt collectives dist emergency ft lighthouse preempt profiler progress "
                      "parallel sampler saving staging state steptime streaming frameworks hf "
                      "pl sitehook titan fetchplan reader resume itembytes trackers mlflowhook"),
    ("mncloud.doctor", "__main__ bandwidth checks gang meeting mesh node trackers"),
    ("mncloud.spec", "launch scriptargs"),
    ("mncloud.request", ""),
    ("mncloud.plan", "costmodel explain hardware hazards learned model profile sharding "
                     "stepmodel timing traces"),
    ("mncloud.deadline", "places policy pricing replay replay_places"),
    ("mncloud.render", "bandwidth jobgroup network schema trackers"),
    ("mncloud.records", "model lineage index store ledger goodput rerun mlflowrun "
     "wandbfigures trackers"),
    ("mncloud.backends", "base"),
    ("mncloud.backends.local", "__main__ backend chaos ckptdir execute exits figures lifecycle "
                               "metadata netcheck nodes processes recordwriter replacing "
                               "resumecheck state supervisor vm warm warmclient warmhost warmrun"),
    ("mncloud.backends.skypilot", "backend cancel cluster dryrun errors events find group host "
                                  "logs lost meta netcheck notice status task"),
    ("mncloud.backends.registry", ""),
    ("mncloud.launch", ""),
    ("mncloud.control", "access billing down elastic handoff horizon identity keeper lease loop "
                        "markets outcomes pacing places placing progress recovery start state "
                        "steering unsure watch"),
    ("mncloud.operate", "logs status stop telemetry"),
    ("mncloud.ui", "app curves serve svg views"),
    ("mncloud.cli", "_common chaos ckpt control doctor exec export follow gpus job_options "
                    "metrics ops options params plan plan_options plan_rows plan_tables profile "
                    "render replay runs ui up values"),
    ("mncloud.__main__", ""),
]  # fmt: skip

#: Modules that may name modules of the tree in a string they do not import, and why.
MODULE_STRINGS: dict[str, str] = {
    "mncloud.backends.local.processes": "the supervisor's `python -m` entry point",
    "mncloud.backends.local.netcheck": "`python -m mncloud.doctor node` on each simulated node",
    "mncloud.control.keeper": "its own `python -m` entry point (the detached controller)",
    "mncloud.plan.profile": "`python -m mncloud.train.profiler`, the profiling run",
    "mncloud.plan.hardware": "its package's data file (`importlib.resources`)",
}

#: Modules that may call `import_module` with a name built at run time, and why: each string
#: they hold that names a module of the tree is one of their edges.
DYNAMIC_IMPORTS: dict[str, str] = {
    "mncloud.backends.registry": "an engine from its table of dotted paths, when asked for",
    "mncloud.backends.local.warmhost": "its WARM_MODULES, ahead of a training script",
    "mncloud.storage.retry": "the storage SDKs' own modules (not ours)",
    "mncloud.cli": "a command's module from its table (`COMMANDS`), when the command is run",
}

#: A dotted module name, maybe with `:attribute` (a bare `"mncloud"` is the program's name).
_MODULE_STRING = re.compile(r"[A-Za-z_]\w*((\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?|:[A-Za-z_]\w*)")
_IMPORT_CALLS = {"import_module", "__import__"}


@dataclass
class Scan:
    """What an AST pass over a package finds: its import graph and what it refuses."""

    graph: dict[str, set[str]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root` by dotted name (a package by its own name)."""
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def bound_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (None when a `*` import makes them unknown)."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        else:
            for block in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, block, []))
    return names


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def scan(
    root: Path,
    package: str,
    module_strings: dict[str, str] | None = None,
    dynamic_imports: dict[str, str] | None = None,
) -> Scan:
    """The import graph of `package` (module → the modules of `package` it imports) and the
    refusals (see the module docstring); the allowlists default to this repository's."""
    strings_ok = MODULE_STRINGS if module_strings is None else module_strings
    dynamic_ok = DYNAMIC_IMPORTS if dynamic_imports is None else dynamic_imports
    mods = modules(root, package)
    trees = {name: ast.parse(path.read_text()) for name, path in mods.items()}
    out = Scan(graph={name: set() for name in mods})
    for name, tree in trees.items():
        here = name if mods[name].name == "__init__.py" else name.rpartition(".")[0]
        imported: list[str] = []
        loggers = {
            id(node.args[0])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _called(node) == "getLogger" and node.args
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    imported.append(sub if sub in mods else base)
                    if sub not in mods and base in mods and alias.name != "*":
                        bound = bound_names(trees[base])
                        if bound is not None and alias.name not in bound:
                            out.refused.append(f"{name}: `from {base} import {alias.name}` "
                                               f"names nothing {base} binds")  # fmt: skip
            elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                if node in tree.body:
                    out.refused.append(f"{name}: a module `__getattr__` (a lazy facade)")
            elif isinstance(node, ast.Call) and _called(node) in _IMPORT_CALLS and node.args:
                first = node.args[0]
                literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
                if literal:
                    imported.append(first.value)  # type: ignore[union-attr]
                elif name not in dynamic_ok:
                    out.refused.append(f"{name}: `{_called(node)}` of a name built at run time")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in loggers
                and _MODULE_STRING.fullmatch(node.value)
                and node.value.partition(":")[0] in mods
            ):
                if name in dynamic_ok or _import_argument(tree, node):
                    imported.append(node.value.partition(":")[0])
                elif name not in strings_ok:
                    out.refused.append(f"{name}: the module string {node.value!r}")
        imported += _submodules_reached(tree, mods, here)
        for target in imported:
            parts = target.split(".")
            for i in range(1, len(parts)):  # the packages it runs on the way
                pkg = ".".join(parts[:i])
                if pkg in mods and not (name == pkg or name.startswith(pkg + ".")):
                    out.graph[name].add(pkg)
            if target in mods and target != name:
                out.graph[name].add(target)
    return out


def _submodules_reached(tree: ast.Module, mods: dict[str, Path], here: str) -> list[str]:
    """Submodules used as attributes of an imported package (`import p` … `p.sub.f()`,
    `from p import q` … `q.sub`): each works only if something loaded it, so it is an edge."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    reached = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                chain.insert(0, inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and bound.get(inner.id) in mods:
                module = bound[inner.id]
                for attr in chain:
                    if f"{module}.{attr}" not in mods:
                        break
                    module = f"{module}.{attr}"
                    reached.append(module)
    return reached


def _import_argument(tree: ast.Module, constant: ast.Constant) -> bool:
    """Whether `constant` is the literal first argument of `import_module` / `__import__`."""
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
    return any(_called(call) in _IMPORT_CALLS and call.args[:1] == [constant] for call in calls)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of `package` it imports (see the module docstring)."""
    return scan(root, package).graph


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


def room_of(module: str, rooms: list[tuple[str, str]]) -> int:
    """The index of the room that names `module` (itself, or one of its listed modules), -1
    for none."""
    for i, (room, members) in enumerate(rooms):
        if module == room or module in {f"{room}.{m}" for m in members.split()}:
            return i
    return -1


def unplaced(graph: dict[str, set[str]], rooms: list[tuple[str, str]]) -> list[str]:
    """Modules no room names, each with where it would go."""
    return [
        f"{m}: add {m.rpartition('.')[2]!r} to the modules of ROOMS' {m.rpartition('.')[0]!r}, "
        "or give it a room of its own"
        for m in sorted(graph)
        if room_of(m, rooms) < 0
    ]


def order_violations(graph: dict[str, set[str]], rooms: list[tuple[str, str]]) -> list[str]:
    """Imports that reach a later room, as 'a (room i) imports b (room j)'."""
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            i, j = room_of(name, rooms), room_of(target, rooms)
            if j > i:
                out.append(f"{name} (room {i}) imports {target} (room {j})")
    return out


@pytest.mark.slow
def test_no_import_circle() -> None:
    found = circles(import_graph(ROOT, "mncloud"))
    assert not found, "import circles:\n" + "\n".join(" → ".join(c) for c in found)


@pytest.mark.slow
def test_every_module_has_a_room_and_the_order_holds() -> None:
    graph = import_graph(ROOT, "mncloud")
    assert unplaced(graph, ROOMS) == []
    assert order_violations(graph, ROOMS) == []


@pytest.mark.slow
def test_nothing_hides_an_edge() -> None:
    assert scan(ROOT, "mncloud").refused == []


def test_every_room_lists_modules_that_exist() -> None:
    mods = modules(ROOT, "mncloud")
    listed = [room for room, _ in ROOMS] + [f"{r}.{m}" for r, ms in ROOMS for m in ms.split()]
    assert [m for m in listed if m not in mods] == []
    assert len(listed) == len(set(listed))


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A tiny package: `pkg.a` imports `pkg.b`; `pkg.low` is a room below `pkg.a`."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    (pkg / "low.py").write_text("")
    return tmp_path


PLANTED_ROOMS = [("pkg", "low b"), ("pkg.a", "")]


def test_the_checks_catch_a_planted_circle_and_a_planted_inversion(planted: Path) -> None:
    assert circles(import_graph(planted, "pkg")) == []
    assert order_violations(import_graph(planted, "pkg"), PLANTED_ROOMS) == []
    (planted / "pkg" / "b.py").write_text("def f():\n    from pkg.a import g\n")
    assert circles(import_graph(planted, "pkg")) == [["pkg.a", "pkg.b", "pkg.a"]]
    (planted / "pkg" / "low.py").write_text("if False:\n    import pkg.a\n")
    assert "pkg.low (room 0) imports pkg.a (room 1)" in order_violations(
        import_graph(planted, "pkg"), PLANTED_ROOMS
    )


def test_a_submodule_importing_its_package_init_that_imports_it_back_is_a_circle(
    planted: Path,
) -> None:
    (planted / "pkg" / "__init__.py").write_text("from pkg.b import f\nX = 1\n")
    assert circles(import_graph(planted, "pkg")) == []
    (planted / "pkg" / "b.py").write_text("from pkg import X\n")
    assert circles(import_graph(planted, "pkg")) == [["pkg", "pkg.b", "pkg"]]


@pytest.mark.parametrize(
    "call", ['importlib.import_module("pkg.a")', '__import__("pkg.a")', 'import_module("pkg.a")']
)
def test_an_import_by_name_is_an_edge_and_closes_a_circle(planted: Path, call: str) -> None:
    (planted / "pkg" / "b.py").write_text(
        f"import importlib\nfrom importlib import import_module\n\n\ndef f():\n    {call}\n"
    )
    found = scan(planted, "pkg", {}, {})
    assert found.refused == []
    assert circles(found.graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_a_submodule_reached_as_an_attribute_is_an_edge(planted: Path) -> None:
    (planted / "pkg" / "b.py").write_text("import pkg\n\n\ndef f():\n    return pkg.a.g\n")
    assert circles(import_graph(planted, "pkg")) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_a_lazy_facade_is_refused(planted: Path) -> None:
    (planted / "pkg" / "__init__.py").write_text(
        "import importlib\n\n\ndef __getattr__(name):\n"
        "    return getattr(importlib.import_module(f'{__name__}.b'), name)\n"
    )
    (planted / "pkg" / "low.py").write_text("from pkg import f\n")
    assert scan(planted, "pkg", {}, {}).refused == [
        "pkg: a module `__getattr__` (a lazy facade)",
        "pkg: `import_module` of a name built at run time",
        "pkg.low: `from pkg import f` names nothing pkg binds",
    ]


def test_a_module_string_is_refused_or_allowed_and_an_edge_where_imported_by_name(
    planted: Path,
) -> None:
    (planted / "pkg" / "b.py").write_text(
        "import logging\n\nlog = logging.getLogger('pkg.a')\nTARGET = 'pkg.a:Thing'\n"
    )
    assert scan(planted, "pkg", {}, {}).refused == ["pkg.b: the module string 'pkg.a:Thing'"]
    named = scan(planted, "pkg", {"pkg.b": "names a process"}, {})
    assert (named.refused, named.graph["pkg.b"]) == ([], set())
    imported = scan(planted, "pkg", {}, {"pkg.b": "imports its table by name"})
    assert imported.refused == []
    assert circles(imported.graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_an_inversion_between_neighbouring_rooms_is_caught(planted: Path) -> None:
    (planted / "pkg" / "b.py").write_text("from pkg import low\n")
    rooms = [("pkg", "b a"), ("pkg.low", "")]  # b's room comes before low's
    assert order_violations(import_graph(planted, "pkg"), rooms) == [
        "pkg.b (room 0) imports pkg.low (room 1)"
    ]


def test_a_module_no_room_names_is_named(planted: Path) -> None:
    (planted / "pkg" / "new.py").write_text("")
    assert unplaced(import_graph(planted, "pkg"), PLANTED_ROOMS) == [
        "pkg.new: add 'new' to the modules of ROOMS' 'pkg', or give it a room of its own"
    ]


def test_each_package_docstring_names_every_module_in_it() -> None:
    """The maps stay true: a package's `__init__` docstring names each of its module files
    (`name.py`) and subpackages (`name/`)."""
    missing = {}
    for init in sorted((ROOT / "mncloud").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        files = [p.name for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        subs = [f"{p.name}/" for p in init.parent.iterdir() if (p / "__init__.py").is_file()]
        if absent := sorted(name for name in files + subs if name not in doc):
            missing[init.parent.relative_to(ROOT).as_posix()] = absent
    assert missing == {}


def test_contributing_names_every_package_and_top_level_module() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = "\n".join(line for line in text.splitlines() if line.startswith("| `"))
    top = ROOT / "mncloud"
    rooms = [f"`{p.name}/`" for p in top.iterdir() if (p / "__init__.py").is_file()]
    rooms += [f"`{p.name}`" for p in top.glob("*.py") if not p.name.startswith("__")]
    assert sorted(room for room in rooms if room not in table) == []
