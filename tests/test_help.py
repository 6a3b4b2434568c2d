"""Every command's help and every command's answer to a bad option, as users run them.

The commands are found by walking the Typer app, so a new command is covered without editing this
file; the walk's size is printed in pytest's summary. Each case goes through `mncloud.cli.main`,
the console script's entry point, and a few through the installed `mncloud` script itself.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer.main

from mncloud.cli import COMMANDS as TABLE
from mncloud.cli import app, main

WIDTH = 80


def _walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not sub.hidden:
            found += _walk(sub, (*path, name))
    return found


COMMANDS = _walk(typer.main.get_command(app))
IDS = [" ".join(path) or "mncloud" for path, _ in COMMANDS]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    else:
        code = 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setenv("LINES", "24")


def test_the_walk_finds_the_commands() -> None:
    assert {"render", "plan", "up", "ckpt", "ckpt ls", "chaos"} <= set(IDS)


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=IDS)
def test_help_at_80_columns(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([*path, "--help"], capsys)
    assert code == 0, err
    assert "Traceback" not in out + err and not err
    assert out.startswith("Usage: mncloud")
    wide = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines wider than {WIDTH}: {wide[0]!r}"


def _checked(param: Any) -> bool:
    """Whether the option's value is a number or a choice (click's type, or Typer ≥0.23's)."""
    click_type = getattr(getattr(param, "type", None), "name", "")
    if click_type in ("integer", "float", "choice") or "range" in click_type:
        return True
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation in (int, float) or (
        isinstance(annotation, type) and issubclass(annotation, Enum)
    )


def _bad_option(command: Any) -> tuple[list[str], str]:
    """An option given a value it cannot take (or, where none takes a checked value, no option)."""
    for param in command.params:
        if param.param_type_name != "option" or param.is_flag or param.count:
            continue
        if _checked(param):
            name = max(param.opts, key=len)
            return [name, "not-a-value"], name
    return ["--no-such-option"], "--no-such-option"


@pytest.mark.parametrize("path,command", COMMANDS, ids=IDS)
def test_a_bad_option_is_one_line_and_exit_2(
    path: tuple[str, ...], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, name = _bad_option(command)
    code, out, err = _run([*path, *bad], capsys)
    assert code == 2, (out, err)
    assert not out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert name in lines[0]
    assert "Traceback" not in err and "╭" not in err


def test_no_arguments_prints_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([], capsys)
    assert code == 0 and out.startswith("Usage: mncloud") and not err


def test_shell_completion_is_offered(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "--install-completion" in out and "--show-completion" in out


def _script() -> str:
    found = Path(sys.executable).parent / "mncloud"
    return str(found) if found.exists() else shutil.which("mncloud") or pytest.skip("no script")


@pytest.mark.parametrize(
    "args,code",
    [(["up", "--help"], 0), (["render", "--help"], 0), (["plan", "--nodes", "0"], 2)],
    ids=["up --help", "render --help", "plan --nodes 0"],
)
def test_the_console_script(args: list[str], code: int) -> None:
    env = {**os.environ, "COLUMNS": str(WIDTH)}
    done = subprocess.run([_script(), *args], capture_output=True, text=True, env=env)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    if code == 2:
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    else:
        assert "s3://name[/prefix]" in " ".join(done.stdout.split())


def test_the_console_script_completes_a_command() -> None:
    env = {**os.environ, "_MNCLOUD_COMPLETE": "complete_bash", "COMP_WORDS": "mncloud ck"}
    done = subprocess.run(
        [_script()], capture_output=True, text=True, env={**env, "COMP_CWORD": "1"}
    )
    assert done.returncode == 0 and done.stdout.split() == ["ckpt"], done.stderr


#: The help panels of the commands that take the shared options, in the order they are shown.
PANELS = {
    ("up",): ["Essentials", "Planning & cost", "Deadline", "Local rehearsal", "Advanced"],
    ("render",): ["Essentials", "Planning & cost", "Advanced"],
    ("plan",): ["Essentials", "Planning & cost", "Deadline", "Advanced"],
    ("replay",): ["Essentials", "Deadline"],
}


def _headings(out: str) -> list[str]:
    return [line[:-1] for line in out.splitlines() if line.endswith(":") and line[0].isupper()]


@pytest.mark.parametrize("path", list(PANELS), ids=[" ".join(p) for p in PANELS])
def test_options_are_grouped_in_help_panels(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain-text help (rich markup off) still shows the panels, in order, `--help` last."""
    code, out, _ = _run([*path, "--help"], capsys)
    assert code == 0
    headings = _headings(out)
    assert [h for h in headings if h not in ("Usage", "Arguments", "Options")] == PANELS[path]
    assert headings[-1] == "Options" and out.rstrip().endswith("Show this message and exit.")
    essentials = out.split("Essentials:")[1].split("\n\n")[0]
    assert "--help" not in essentials


def test_up_puts_the_first_options_a_user_needs_first(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(["up", "--help"], capsys)
    essentials = out.split("Essentials:")[1].split("Planning & cost:")[0]
    for flag in ("--gpus", "--nodes", "--cloud", "--bucket", "--name", "--resume", "--yes"):
        assert flag in essentials, flag
    local = out.split("Local rehearsal:")[1].split("Advanced:")[0]
    assert "--chaos-preempt-after" in local and "--spot-trace" in local
    assert "--retry-on-error" not in out  # a hidden, deprecated alias of --max-restarts


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=IDS)
def test_every_option_is_shown_once(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """A panel never loses or repeats an option: each visible option's flag is listed once."""
    command = dict(zip(IDS, [c for _, c in COMMANDS], strict=True))[" ".join(path) or "mncloud"]
    _, out, _ = _run([*path, "--help"], capsys)
    listed = [line.split()[0].rstrip(",") for line in out.splitlines() if line.startswith("  -")]
    flags = [f for param in command.params for f in (*param.opts, *param.secondary_opts)]
    assert sorted({f for f in flags if flags.count(f) > 1}) == []  # one option per flag
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden:
            assert sum(listed.count(flag) for flag in set(param.opts)) == 1, param.opts


def test_control_is_hidden_but_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`up --deadline` starts `python -m mncloud control NAME`: out of the help, still there."""
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "up" in out.split("Commands:")[1]
    assert "control" not in out.split("Commands:")[1]
    code, out, err = _run(["control", "--help"], capsys)
    assert code == 0 and "Steer a deadline run" in out, err
    code, out, err = _run(["control", "no-such-run"], capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


#: What no `--help` may load: the validation library, the request's models, the heavy stacks.
NOT_FOR_HELP = (
    "pydantic",
    "mncloud.spec",
    "mncloud.spec.launch",
    "mncloud.request",
    "torch",
    "sky",
    "yaml",
    "jinja2",
)


def test_help_loads_neither_pydantic_nor_the_spec() -> None:
    """`mncloud --help` and every command's `--help` in one fresh interpreter: the help text
    is plain data (`mncloud.options`), so none of NOT_FOR_HELP is imported (`mncloud --help`
    stays near a bare `python -c pass`: bench/cli_startup.py measures it)."""
    code = (
        "import sys\nfrom mncloud.cli import main\n"
        f"for path in {[list(path) for path, _ in COMMANDS]!r}:\n"
        "    try:\n        main([*path, '--help'])\n    except SystemExit:\n        pass\n"
        f"print('\\nLOADED', [m for m in {NOT_FOR_HELP!r} if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Usage: mncloud") == len(COMMANDS)
    assert proc.stdout.strip().endswith("LOADED []"), proc.stdout[-300:]


def _loaded_after(args: list[str]) -> dict[str, Any]:
    """Run `mncloud ARGS` in a fresh interpreter: its output and the modules it loaded."""
    code = (
        "import json, sys\nfrom mncloud.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('\\nLOADED', json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "COLUMNS": str(WIDTH)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out, loaded = proc.stdout.rsplit("\nLOADED ", 1)
    return {"out": out, "loaded": set(json.loads(loaded))}


def test_the_root_help_imports_no_command_module() -> None:
    """`mncloud --help` lists every command from the table (`mncloud.cli.COMMANDS`), loading
    no command's module, nor rich, pydantic or the options' data; `mncloud plan --help` loads
    plan's only."""
    modules = {entry.module for entry in TABLE.values()}
    root = _loaded_after(["--help"])
    listed = [line.split()[0] for line in root["out"].split("Commands:\n")[1].splitlines()]
    assert listed == [name for name, entry in TABLE.items() if not entry.hidden]
    assert root["loaded"] & {*modules, "rich", "pydantic", "mncloud.options"} == set()
    assert _loaded_after(["plan", "--help"])["loaded"] & modules == {"mncloud.cli.plan"}


def test_the_table_says_what_the_commands_say() -> None:
    """Each table entry's help line and hidden flag are its command's, at every width a listing
    uses; every command a module registers is in the table; the root's help is the same byte
    for byte before and after every command is built."""
    group: Any = typer.main.get_command(app)
    ctx = group.make_context("mncloud", [], resilient_parsing=True)
    from_the_table = group.get_help(ctx)
    for name, entry in TABLE.items():
        with group.commands.stand_ins():
            stand_in = group.commands[name]
        built = group.commands[name]
        assert (built.name, built.hidden) == (name, entry.hidden)
        for limit in range(20, 81):
            assert stand_in.get_short_help_str(limit) == built.get_short_help_str(limit), name
    assert group.get_help(ctx) == from_the_table
    registering = {
        f"mncloud.cli.{path.stem}"
        for path in (Path(__file__).parents[1] / "mncloud" / "cli").glob("*.py")
        if "\ndef register(" in path.read_text()
    }
    assert registering <= {entry.module for entry in TABLE.values()}
    for module in registering:
        everything = typer.Typer()
        importlib.import_module(module).register(everything)
        names = [c.name for c in everything.registered_commands]
        assert set(names + [g.name for g in everything.registered_groups]) <= set(TABLE)
