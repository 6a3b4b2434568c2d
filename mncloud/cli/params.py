"""How a command gets its parameters and shows them: option groups and help panels.

`group` and `command` let a command take the shared options by group (`mncloud.cli.options`
declares both), so no parameter list is written twice.

Options name their help panel with Typer's `rich_help_panel=`. Typer draws panels only in its
rich help, which `rich_markup_mode=None` turns off (`mncloud.cli`), and then lists every option
under one "Options" heading. `PanelCommand` writes the same panels as plain sections instead;
`use_panels` makes it the class of every command of an app.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

ESSENTIALS = "Essentials"
PLAN_PANEL = "Planning & cost"
DEADLINE_PANEL = "Deadline"
LOCAL_PANEL = "Local rehearsal"
ADVANCED = "Advanced"
#: The order panels are shown in; a panel not named here follows them, in order of appearance.
ORDER = (ESSENTIALS, PLAN_PANEL, DEADLINE_PANEL, LOCAL_PANEL, ADVANCED)
#: Options without a panel (`--help`, a command's own odd ones) come last, under this heading.
OTHER = "Options"


class PanelCommand(TyperCommand):
    """A Typer command whose plain-text help lists its options panel by panel."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:  # a hidden option
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            elif param.param_type_name == "option":
                panel = getattr(param, "rich_help_panel", None) or OTHER
                panels.setdefault(panel, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for panel in sorted(panels, key=lambda name: _rank(name, list(panels))):
            with formatter.section(panel):
                formatter.write_dl(panels[panel])


def _rank(panel: str, seen: list[str]) -> tuple[int, int]:
    if panel == OTHER:
        return (2, 0)
    if panel in ORDER:
        return (0, ORDER.index(panel))
    return (1, seen.index(panel))


def plain_flags(params: list[Any]) -> list[Any]:
    """Give each boolean flag not yet coerced Typer's pass-through coercion, which is what a
    flag's value (None or a bool, neither of which Typer coerces) gets anyway. Else Typer builds
    a pydantic adapter for a group's unset `--help`, and `mncloud CMD --help` loads pydantic for
    nothing. A Typer without this machinery is left as it is."""
    for param in params:
        described = getattr(param, "type_descriptor", None)
        unbuilt = getattr(param, "_runtime_param", "absent") is None
        if unbuilt and described is not None and described.annotation is bool:
            from typer import _coercion

            param._runtime_param = _coercion.PassThroughRuntimeParam(
                annotation=bool, parameter_info=described.parameter_info
            )
    return params


class PlainFlagsGroup(TyperGroup):
    """A command group whose boolean flags are read without pydantic (`plain_flags`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_flags(super().get_params(ctx))


def use_panels(app: typer.Typer) -> None:
    """Give every command of `app` (and of its sub-apps) that names no class of its own (Typer's
    default) the panel help, and every sub-app `PlainFlagsGroup`; call it once every command is
    registered."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = PanelCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_panels(group.typer_instance)
            if not isinstance(group.cls, type):
                group.cls = PlainFlagsGroup


def group(*items: tuple[str, Any, Any]) -> tuple[inspect.Parameter, ...]:
    """Keyword-only parameters from (name, annotation, default) triples."""
    kind = inspect.Parameter.KEYWORD_ONLY
    return tuple(inspect.Parameter(n, kind, annotation=a, default=d) for n, a, d in items)


def command(*groups: tuple[inspect.Parameter, ...]) -> Any:
    """Decorator: the command function takes its own parameters, then the groups' ones.

    The function declares its own options as usual and `**values` for the shared ones; Typer
    reads the combined signature, so `mncloud up --help` lists every option of every group.
    """

    def wrap(func: Any) -> Any:
        own = [
            p
            for p in inspect.signature(func, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        shared = [p for group in groups for p in group]
        func.__signature__ = inspect.Signature([*own, *shared])
        return func

    return wrap
