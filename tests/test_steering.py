"""The controller's helpers see it through `steering.Steering`, and only through public members:
no Protocol restates a private method of `loop.Controller`, and no helper reaches one."""

from __future__ import annotations

import ast
from pathlib import Path

from mncloud.control.loop import Controller
from mncloud.control.steering import Steering

CONTROL = Path(__file__).resolve().parents[1] / "mncloud" / "control"
#: The modules that take the controller as `ctl: Steering` (or a Protocol built on it).
HELPERS = ("billing", "elastic", "outcomes", "recovery", "unsure")


def _members(protocol: type) -> set[str]:
    tree = ast.parse((CONTROL / "steering.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == protocol.__name__)
    return {
        n.target.id if isinstance(n, ast.AnnAssign) else n.name  # type: ignore[union-attr]
        for n in body.body
        if isinstance(n, ast.FunctionDef | ast.AnnAssign)
    }


def test_steering_lists_only_public_members_the_controller_has() -> None:
    members = _members(Steering)
    assert {"state", "backend", "clock", "course", "launch", "take_down"} <= members
    assert not [name for name in members if name.startswith("_")]
    methods = {name for name in members if callable(getattr(Steering, name, None))}
    assert methods and all(callable(getattr(Controller, name, None)) for name in methods)


def test_no_helper_reaches_a_private_member_of_the_controller() -> None:
    reached = [
        f"{module}: ctl.{node.attr}"
        for module in HELPERS
        for node in ast.walk(ast.parse((CONTROL / f"{module}.py").read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ctl"
        and node.attr.startswith("_")
    ]
    assert reached == []
