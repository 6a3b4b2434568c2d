"""The site's references, generated from the code (a MkDocs hook, `hooks:` in mkdocs.yml).

A page holds a marker where a reference goes; `on_page_markdown` puts the reference there:

    <!-- generated: cli -->      every command of the Typer app, its options by help panel
    <!-- generated: config -->   every `mncloud.yaml` key: `JobOptions`' fields, their docstrings,
                                 defaults and bounds (`Meta`), and the flag that sets each
    <!-- generated: readme -->   README.md as the home page (and CONTRIBUTING.md, CHANGELOG.md)
    <!-- generated: api-train -->  each public name of `mncloud.train` (its `__all__`), by
                                 mkdocstrings from its docstring; `api-storage` likewise

Nothing is written twice: the help texts are the CLI's own, the keys' meanings the fields'
docstrings. Each command's example comes from `scripts/cli_examples.yaml` (`examples()`).
tests/test_docs.py checks that every flag has help, every key a docstring and every command an
example.
"""

from __future__ import annotations

import ast
import html
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- generated: ([\w-]+) -->")
EXAMPLES = ROOT / "scripts" / "cli_examples.yaml"


def examples() -> dict[str, dict[str, str]]:
    """Each command's example, by its path (`mncloud ckpt ls`): `run`, the command line, and
    `not-run`, why the suite does not run it (absent: it runs)."""
    import yaml

    return dict(yaml.safe_load(EXAMPLES.read_text()) or {})


def _text(value: str) -> str:
    """Help text as Markdown: code spans kept, everything else escaped (`<bucket>`, `*`)."""
    parts = re.split(r"(`[^`]*`)", " ".join(value.split()))
    out = []
    for part in parts:
        if part.startswith("`"):
            out.append(part)
        else:
            part = html.escape(part, quote=False)
            out.append(re.sub(r"([*_\[\]|\\])", r"\\\1", part))
    return "".join(out)


def root_command() -> Any:
    """The click command the `mncloud` console script runs (its commands built on lookup)."""
    import typer.main

    from mncloud.cli import app

    return typer.main.get_command(app)


def commands(hidden: bool = False) -> Iterator[tuple[str, Any, Any]]:
    """(path, command, context) of every command, depth first, in help's order; hidden ones
    (internal, like `control`) only when asked."""

    def walk(path: str, cmd: Any, parent: Any) -> Iterator[tuple[str, Any, Any]]:
        ctx = cmd.context_class(cmd, info_name=path.split()[-1], parent=parent)
        if parent is not None:
            yield path, cmd, ctx
        if hasattr(cmd, "list_commands"):  # a group (Typer's click, or its own copy of it)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and (hidden or not sub.hidden):
                    yield from walk(f"{path} {name}", sub, ctx)

    yield from walk("mncloud", root_command(), None)


def options(cmd: Any) -> list[Any]:
    """A command's visible options (click `Option`s), `--help` left out."""
    return [
        p
        for p in cmd.params
        if p.param_type_name == "option" and not p.hidden and "--help" not in p.opts
    ]


def option_names(cmd: Any) -> set[str]:
    """Every spelling of a command's options, hidden ones included (`--spot`, `--on-demand`)."""
    names = {"--help"}
    for p in cmd.params:
        if p.param_type_name == "option":
            names.update(p.opts, p.secondary_opts)
    return names


def _anchor(path: str, opt: str = "") -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{path} {opt}".lower()).strip("-")


def _default(p: Any) -> str:
    if p.is_flag and p.secondary_opts:
        return "" if p.default is None else (p.opts[0] if p.default else p.secondary_opts[0])
    if p.default in (None, False, (), []) or callable(p.default):
        return ""
    return f"`{p.default}`"


def _command_markdown(path: str, cmd: Any, ctx: Any) -> list[str]:
    level = "#" * min(path.count(" ") + 1, 4)
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out = [f"{level} `{path}` {{#{_anchor(path)}}}", "", f"`{path} {usage}`", ""]
    if cmd.help:
        out += [_text(cmd.help), ""]
    example = examples().get(path)
    if example:
        reason = example.get("not-run")
        out += ["Example:", ""] + ([f"<!-- not-run: {reason} -->"] if reason else [])
        out += ["```bash", example["run"], "```", ""]
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    if args:
        out += ["| argument | |", "|---|---|"]
        out += [
            f"| `{a.metavar or a.name.upper()}` | {_text(getattr(a, 'help', None) or '')} |"
            for a in args
        ]
        out.append("")
    panels: dict[str, list[Any]] = {}
    for p in options(cmd):
        panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(p)
    for panel, params in panels.items():
        out += [f"**{panel}**", "", "| option | |", "|---|---|"]
        for p in params:
            record = p.get_help_record(ctx)  # ("--gpus TEXT", …) as --help shows it
            spelled = record[0] if record else "/".join(p.opts + p.secondary_opts)
            cell = f'<span id="{_anchor(path, p.opts[0])}"></span>`{spelled}`'
            default = f" Default: {_default(p)}." if _default(p) else ""
            out.append(f"| {cell} | {_text(p.help or '')}{default} |")
        out.append("")
    return out


def cli_markdown() -> str:
    """The CLI reference: every visible command and option, from the Typer app itself."""
    out: list[str] = []
    for path, cmd, ctx in commands():
        out += _command_markdown(path, cmd, ctx)
    return "\n".join(out)


def field_docs() -> dict[str, str]:
    """`JobOptions`' attribute docstrings, by field (read from options.py's source)."""
    tree = ast.parse((ROOT / "mncloud" / "options.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JobOptions")
    docs: dict[str, str] = {}
    for before, node in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(before, ast.AnnAssign)
            and isinstance(before.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[before.target.id] = " ".join(node.value.value.split())
    return docs


def _type(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    names = {"str": "text", "int": "integer", "float": "number", "bool": "true/false"}
    spelled = []
    for a in args:
        origin = typing.get_origin(a)
        if origin is list:
            spelled.append("a list")
        elif origin is dict:
            spelled.append("a mapping")
        else:
            spelled.append(names.get(getattr(a, "__name__", str(a)), str(a)))
    return " or ".join(spelled)


def _bounds(meta: Any) -> str:
    said = []
    if meta.ge is not None and meta.le is not None:
        said.append(f"{meta.ge:g} to {meta.le:g}")
    else:
        said += [f"≥ {meta.ge:g}"] if meta.ge is not None else []
        said += [f"> {meta.gt:g}"] if meta.gt is not None else []
        said += [f"≤ {meta.le:g}"] if meta.le is not None else []
    return ", ".join(said)


def job_flags() -> dict[str, str]:
    """Each job option's flag spellings, by field name, from the commands that declare it."""
    from mncloud.options import JOB_FIELDS

    flags: dict[str, str] = {}
    for _, cmd, _ in commands():
        for p in options(cmd):
            if p.name in JOB_FIELDS and p.name not in flags:
                flags[p.name] = ", ".join(f"`{o}`" for o in p.opts + p.secondary_opts)
    return flags


def config_markdown() -> str:
    """The `mncloud.yaml` keys: `ProjectConfig`'s fields (`JobOptions` less the flag-only)."""
    from mncloud.options import FLAG_ONLY, JobOptions, meta
    from mncloud.request import ProjectConfig

    hints = typing.get_type_hints(JobOptions)
    docs, flags = field_docs(), job_flags()
    out = ["| key | takes | default | flag | meaning |", "|---|---|---|---|---|"]
    for key in ProjectConfig.model_fields:
        m = meta(key)
        default = "" if m.default is None else f"`{str(m.default).lower()}`"
        takes = _type(hints[key]) + (f", {_bounds(m)}" if _bounds(m) else "")
        key_cell = f'<span id="key-{key.replace("_", "-")}"></span>`{key}`'
        meaning = _text(docs.get(key, ""))
        out.append(f"| {key_cell} | {takes} | {default} | {flags.get(key, '')} | {meaning} |")
    out += ["", "Job options given on the command line only (no key):", ""]
    out += [f"- {flags.get(k, k)}: {_text(docs.get(k, ''))}" for k in FLAG_ONLY]
    return "\n".join(out)


def _page_of(name: str) -> str:
    """A Markdown file of the repository's root as a page of the site: its links into docs/
    made relative to the site."""
    text = (ROOT / name).read_text()
    text = re.sub(r"\]\(docs/", "](", text)
    for root_file, page in (("CONTRIBUTING", "contributing"), ("README", "index"),
                            ("CHANGELOG", "changelog")):  # fmt: skip
        text = text.replace(f"]({root_file}.md)", f"]({page}.md)")
    return text


def public_names(package: str) -> list[str]:
    """A package's `__all__`, read from its source (`mncloud.train` would import torch)."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    node = next(
        n for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    )  # fmt: skip
    return list(ast.literal_eval(node.value))


def api_markdown(package: str) -> str:
    """One mkdocstrings block per public name, so the page shows what a script imports and
    not the package's module listing (its `__init__` docstring, for contributors)."""
    return "\n\n".join(
        f"::: {package}.{name}\n    options:\n      heading_level: 3"
        for name in public_names(package)
    )


GENERATORS = {
    "cli": cli_markdown,
    "config": config_markdown,
    "readme": lambda: _page_of("README.md"),
    "contributing": lambda: _page_of("CONTRIBUTING.md"),
    "changelog": lambda: _page_of("CHANGELOG.md"),
    "api-train": lambda: api_markdown("mncloud.train"),
    "api-storage": lambda: api_markdown("mncloud.storage"),
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: each `<!-- generated: NAME -->` marker replaced by its reference."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
