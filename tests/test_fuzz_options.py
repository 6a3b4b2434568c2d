"""Every option of every command, fed hostile values: one line and exit 2, or a success.

The commands and their options are found by walking the Typer app (as tests/test_help.py does),
so a new option is fuzzed without editing this file. Each option gets values of its kind
(number, whole number, duration, path, URL, name): nan, ±inf, 0, negative, 1e308, empty, very
long, unicode, shell metacharacters, `../`. They are given in the commands' real combinations:
each scenario starts from a valid command line (`up` with the whole deadline set, `plan
--deadline … --budget …`) and hypothesis replaces a few of its values, or adds options.

Nothing here starts a run or calls a cloud: `up` always has `--dryrun --cloud local` (and no
valid cloud name is ever fuzzed in), a run name never exists, a URL is never a valid s3:// or
gs:// bucket, and every relative path stays inside the test's own folder. After each example
no run folder and no controller state may exist. Examples are derandomized (the same ones every
run); `MNCLOUD_FUZZ_SCALE=10` tries ten times as many.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mncloud import layout
from mncloud.cli import app

runner = CliRunner()
#: `MNCLOUD_FUZZ_SCALE=10 pytest tests/test_fuzz_options.py`: ten times the examples, locally.
SCALE = int(os.environ.get("MNCLOUD_FUZZ_SCALE", "1"))

NUMBERS = ["nan", "-nan", "inf", "-inf", "0", "-0", "-1", "1e308", "-1e308", "1e-308", "",
           "abc", "1,5", "٣", "0x10", "9" * 400, "1.5", "2"]  # fmt: skip
WHOLE = ["0", "-1", "1e308", "nan", "", "99999999999999999999", "2147483648", "1.5", "٣",
         "9" * 5000, "1", "3"]  # fmt: skip
DURATIONS = ["0", "0h", "-3h", "nan", "nanh", "inf", "1e308h", "9" * 400 + "h", "", "30x",
             "١h", " 5m ", "0.0001s", "8761h", "1.5h", "3h"]  # fmt: skip
HOSTILE = ["", " ", "x" * 300, "ünïcødé-☃", "$(touch pwned)", "; rm -rf ~", "`id`", "a\nb",
           "../", "../../etc/passwd", "-", "--", "%s%n", "\x1b[31mred", "x[/prefix]", "A=B", "=",
           "nan"]  # fmt: skip
#: Relative ones stay inside the test's folder: the cwd is three levels below it.
PATHS = [*HOSTILE, "/nonexistent-mncloud/x.json", "/dev/null", "sub", "sub/", "a" * 300,
         "~nobody-mncloud/x"]  # fmt: skip
#: Never a valid s3:// or gs:// bucket: a valid one would reach the network.
URLS = [*HOSTILE, "s3://", "gs://", "s3://A", "s3://x y", "gs://-bad-", "s3://../x", "ftp://x",
        "file://", "file://../x", "file:///nonexistent-mncloud/x", "s3:/x", "://x"]  # fmt: skip
#: `ckpt` reads any s3:// or gs:// name (legacy buckets too): none of those, they would reach
#: the network.
CKPT_URIS = [u for u in URLS if not u.startswith(("s3://", "gs://")) or u in ("s3://", "gs://")]
#: Written to by the command: only paths inside the test's folder.
OUTPUTS = ["", "out.yaml", "sub", "sub/../o.yaml", "ünï.yaml", "$(id).yaml", "a" * 300]
NAMES = [*HOSTILE, "H100:8", "cpu:0", "cpu:-1", "cpu:nan", "SKYPILOT_X=1", "MNCLOUD_HOME=/",
         "gang", "node", "torchrun", "adaptive", "aws", "LOCAL"]  # fmt: skip
#: No valid cloud besides `local`: another one would plan and dry-run against SkyPilot.
CLOUDS = [*HOSTILE, "nope", "LOCAL", "ａｗｓ", "local "]

DURATION_OPTIONS = {"deadline", "restart_overhead", "start", "every", "recovery_delay",
                    "chaos_preempt_after", "notice"}  # fmt: skip
URL_OPTIONS = {"bucket", "state_uri", "require_path"}
OUTPUT_OPTIONS = {"output", "dest"}
#: Not fuzzed: `down` (it stops runs: another engineer's, covered by its own tests); bool flags.
SKIPPED = {("down",)}


def _kind(param: Any) -> list[str]:
    """The hostile values for one parameter, by its name and annotation."""
    name = param.name
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    text = str(annotation)
    if name in OUTPUT_OPTIONS:
        return OUTPUTS
    if name in DURATION_OPTIONS:
        return DURATIONS
    if name in URL_OPTIONS:
        return URLS
    if name == "uri":
        return CKPT_URIS
    if name == "cloud":
        return CLOUDS
    if annotation is float or "float" in text:
        return NUMBERS
    if annotation is int or "int" in text:
        return WHOLE
    if "Path" in text or name in {"catalog", "requirements", "ckpt_dir", "template"}:
        return PATHS
    return NAMES


def _walk(command: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every command, hidden ones too: `control` is out of the help, not out of reach."""
    found = {path: command}
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found.update(_walk(sub, (*path, name)))
    return found


COMMANDS = {p: c for p, c in _walk(typer.main.get_command(app)).items() if p and p not in SKIPPED}
LEAVES = sorted(p for p, c in COMMANDS.items() if not hasattr(c, "commands"))


def _fuzzable(command: Any) -> tuple[list[Any], list[Any]]:
    """(options that take a value, arguments) of a command."""
    options, arguments = [], []
    for param in command.params:
        if param.param_type_name == "argument":
            arguments.append(param)
        elif not (param.is_flag or param.count or param.name in {"help", "version"}):
            options.append(param)
    return options, arguments


# --------------------------------------------------------------------------- scenarios
# A valid command line per scenario, built in the test's folder: {script} and {trace} exist.

UP = ["up", "{script}", "--gpus", "cpu:1", "--nodes", "2", "--cloud", "local", "--yes",
      "--dryrun", "--name", "fz"]  # fmt: skip
DEADLINE = ["--deadline", "3h", "--hours", "1", "--spot-trace", "{trace}", "--time-scale", "60",
            "--spot-price", "1", "--on-demand-price", "3", "--budget", "100"]  # fmt: skip
PLAN = ["plan", "--gpus", "H100:8", "--hours", "20"]
SCENARIOS: dict[str, tuple[list[str], int]] = {
    # name: (base command line, examples)
    "up": (UP, 25),
    "up --deadline": ([*UP, *DEADLINE], 30),
    "render": (["render", "{script}", "--gpus", "cpu:1", "--cloud", "local"], 25),
    "plan": (PLAN, 10),
    "plan --deadline": ([*PLAN, "--deadline", "30h", "--budget", "5000"], 8),
    "plan --steps": (
        [*PLAN, "--steps", "1000", "--flops-per-step", "1e15", "--gpus", "H100:8,A100-80GB:8"],
        10,
    ),
    # the script has no training loop: each example ends in the profile's one-line error
    "profile": (["profile", "{script}"], 4),
    "replay": (["replay", "{trace}", "--hours", "1", "--deadline", "3h"], 40),
    "rerun": (["rerun", "no-such-run"], 10),
    "exec": (["exec", "no-such-run"], 10),
    "runs ls": (["runs", "ls"], 8),
    "runs show": (["runs", "show", "no-such-run"], 8),
    "runs cost": (["runs", "cost", "no-such-run"], 8),
    "status": (["status", "no-such-run"], 6),
    "logs": (["logs", "no-such-run"], 6),
    "metrics": (["metrics", "no-such-run"], 6),
    "gpus": (["gpus"], 10),
    "control": (["control", "no-such-run"], 10),
    "chaos preempt": (["chaos", "preempt", "no-such-run"], 15),
    "chaos storage-outage": (["chaos", "storage-outage", "no-such-run"], 10),
    "doctor": (["doctor", "{script}"], 12),
    "ckpt ls": (["ckpt", "ls", "{ckpts}"], 8),
    "ckpt verify": (["ckpt", "verify", "{ckpts}", "1"], 8),
    "ckpt pull": (["ckpt", "pull", "{ckpts}", "1", "pulled"], 8),
    "ckpt rm": (["ckpt", "rm", "{ckpts}", "1"], 8),
    "export": (["export", "{ckpts}", "1", "--out", "exported"], 10),
    # --check: the options checked and the app built, no server started.
    "ui": (["ui", "--check"], 15),
}
#: Exit codes a command documents besides 0 and 2 (`doctor`: a check failed).
OTHER_CODES = {"doctor": {1}}
#: Commands that print what they found before the one-line error (`ckpt verify`: verdicts).
PRINT_THEN_FAIL = {"ckpt verify"}


def test_every_command_has_a_scenario() -> None:
    """A new command is a decision: give it a scenario here (or skip it, saying why)."""
    named = {_command_of(base)[0] for base, _ in SCENARIOS.values()}
    assert set(LEAVES) <= named, set(LEAVES) - named


def _command_of(base: list[str]) -> tuple[tuple[str, ...], Any]:
    for length in (2, 1):
        path = tuple(base[:length])
        if path in COMMANDS and not hasattr(COMMANDS[path], "commands"):
            return path, COMMANDS[path]
    raise AssertionError(f"no command for {base}")


@st.composite
def _changes(draw: Callable[..., Any], command: Any) -> list[tuple[str | int, str]]:
    """One to three (option, value) or (argument index, value) changes to a command line."""
    options, arguments = _fuzzable(command)
    targets: list[tuple[str | int, list[str]]] = [(max(o.opts, key=len), _kind(o)) for o in options]
    targets += [(i, _kind(a)) for i, a in enumerate(arguments)]
    picked = draw(st.lists(st.sampled_from(targets), min_size=1, max_size=3, unique_by=str))
    return [(target, draw(st.sampled_from(values))) for target, values in picked]


def _apply(base: list[str], path: tuple[str, ...], changes: list[tuple[str | int, str]]) -> list:
    """The command line with each change: an argument replaced, an option appended (the last
    value of a single-value option wins; a repeatable one gets one more)."""
    args = list(base)
    positions = [i for i in range(len(path), len(args)) if not args[i].startswith("-")]
    positions = [i for i in positions if i == len(path) or not args[i - 1].startswith("-")]
    for target, value in changes:
        if isinstance(target, int):
            if target < len(positions):
                args[positions[target]] = value
        else:
            args += [target, value]
    return args


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test's folder: a project with a script, a trace, a checkpoint folder; the cwd three
    levels below it, so `../` and `../../x` stay inside."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname='p'\n")
    (project / "train.py").write_text("pass\n")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [2, 2, 0, 2] * 30}))
    (tmp_path / "ckpts").mkdir()
    cwd = tmp_path / "a" / "b" / "c"
    (cwd / "sub").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("COLUMNS", "80")
    return {"script": str(project / "train.py"), "trace": str(trace),
            "ckpts": str(tmp_path / "ckpts")}  # fmt: skip


def _nothing_started() -> None:
    runs = layout.run_dir("fz").parent
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
    assert not layout.control_state_file("fz").exists()


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_hostile_values_end_in_one_line_or_success(
    scenario: str, folder: dict[str, str], mncloud_home: Path
) -> None:
    template, examples = SCENARIOS[scenario]
    base = [part.format(**folder) for part in template]
    path, command = _command_of(base)
    allowed = {0, 2} | OTHER_CODES.get(scenario, set())

    @settings(
        max_examples=examples * SCALE,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(changes=_changes(command))
    def check(changes: list[tuple[str | int, str]]) -> None:
        args = _apply(base, path, changes)
        result = runner.invoke(app, args)
        shown = f"mncloud {' '.join(map(repr, args))}\n{result.output}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            shown + "".join(__import__("traceback").format_exception(result.exception))
        )
        assert result.exit_code in allowed, shown
        assert "Traceback" not in result.output, shown
        if result.exit_code == 2:
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), shown
            assert scenario in PRINT_THEN_FAIL or not result.stdout, shown
        _nothing_started()

    check()
