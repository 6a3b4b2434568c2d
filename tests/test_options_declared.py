"""Each job option's default is stated once, by its `JobSpec` field, and everything else comes
to it: the CLI's options (which default to None, so `mncloud.yaml` can fill them), the help text,
`mncloud.yaml`'s keys (`ProjectConfig`, all None) and `build_spec` when neither says a value.
So a new job option is a decision: a field, a `ProjectConfig` key or a `FLAG_ONLY` entry."""

from __future__ import annotations

import ast
import re
import typing
from enum import Enum
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import typer.main

from mncloud.cli import app
from mncloud.cli.options import JOB, MARKET, job_options, launch_options_from
from mncloud.options import (
    JOB_FIELDS,
    MAX_NODES,
    MIN_NODES,
    YAML_KEYS,
    JobOptions,
    job_default,
    meta,
)
from mncloud.request import FLAG_ONLY, ProjectConfig, build_spec
from mncloud.spec import JobSpec, default_of

#: mncloud.yaml keys (flag names) whose `JobSpec` field has another name.
FIELD_OF = {
    "gpus": "accelerator", "cloud": "clouds", "region": "regions", "env": "envs",
    "secret": "secrets", "label": "labels", "require_path": "require_paths",
}  # fmt: skip
#: Options of the job groups that are no field of the spec: how the CLI reads its inputs.
NOT_FIELDS = {"script", "script_args", "catalog", "template", "allow_secret_env"}
#: Fields whose absent value is decided from other inputs, not a constant default.
DERIVED = {"accelerator", "name", "recovery", "clouds"}


def _job_options() -> list[str]:
    return [param.name for group in (MARKET, JOB) for param in group]


def _params(command: str) -> dict[str, Any]:
    click = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in click.params}


def _text(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def test_every_job_option_is_a_project_key_or_flag_only_and_a_spec_field() -> None:
    options = set(_job_options())
    assert set(ProjectConfig.model_fields) == options - NOT_FIELDS
    assert set(FLAG_ONLY) <= options
    for key in ProjectConfig.model_fields:
        assert FIELD_OF.get(key, key) in JobSpec.model_fields, key


@pytest.mark.parametrize("command", ["up", "render", "plan"])
def test_the_cli_and_mncloud_yaml_leave_defaults_to_the_spec(command: str) -> None:
    params = _params(command)
    for key in set(_job_options()) & set(params) - {"script", "script_args"}:
        assert params[key].default in (None, [], ()), (command, key, params[key].default)
    for key, field in ProjectConfig.model_fields.items():
        assert field.default is None, key


@pytest.mark.parametrize("command", ["up", "render", "plan"])
def test_a_default_the_help_names_is_the_specs(command: str) -> None:
    said = re.compile(r"\(default (\w+)\)|(\w+) \(default\)|\((on|off)\)\.?$")
    checked = set()
    for key, param in _params(command).items():
        found = said.search(" ".join((param.help or "").split()))
        if key not in ProjectConfig.model_fields or not found:
            continue
        text = next(g for g in found.groups() if g)
        default = default_of(FIELD_OF.get(key, key))
        expected = ("on" if default else "off") if isinstance(default, bool) else _text(default)
        assert text == expected, (command, key, param.help)
        checked.add(key)
    if command != "plan":
        assert {"nodes", "max_restarts", "preflight", "launcher"} <= checked


def test_a_spec_from_no_flags_and_no_yaml_has_the_declared_defaults(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = build_spec(script, gpus="cpu:1", cloud=["local"])
    for key in ProjectConfig.model_fields:
        field = FIELD_OF.get(key, key)
        if field not in DERIVED:
            assert getattr(spec, field) == default_of(field), field


# ------------------------------------------------------------- one option followed by name
# `nodes` from its Typer option to `templates/task.yaml.j2`, through typed fields only: the
# option's parameter is a `JobOptions` field of the same name and type; `spec_from` reads the
# field as an attribute and hands it to `JobSpec(nodes=…)` (no `**` anywhere in the call);
# `PlanRequest.from_spec` reads `spec.nodes`; render's variables set `num_nodes` from
# `spec.nodes`; the template writes `num_nodes`.

MNCLOUD = Path(__file__).resolve().parents[1] / "mncloud"


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _call(func: ast.FunctionDef, callee: str) -> ast.Call:
    calls = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1] == callee
    ]
    assert len(calls) == 1, (func.name, callee, len(calls))
    return calls[0]


def _keyword(call: ast.Call, name: str) -> str:
    assert all(k.arg is not None for k in call.keywords), f"a **dict in {ast.unparse(call)[:80]}"
    return next(ast.unparse(k.value) for k in call.keywords if k.arg == name)


def test_nodes_is_followed_by_name_from_the_flag_to_the_template() -> None:
    hints = get_type_hints(JobOptions)
    params = _params("up")
    assert "--nodes" in params["nodes"].opts and "nodes" in JOB_FIELDS
    assert f"{MIN_NODES} to {MAX_NODES} (default {job_default('nodes')})" in params["nodes"].help
    for group in (MARKET, JOB):  # a job option's parameter is its field, of a type it holds
        for param in group:
            if param.name in JOB_FIELDS:
                flag_type = typing.get_args(param.annotation)[0]
                assert set(typing.get_args(flag_type)) <= set(typing.get_args(hints[param.name]))
    values = {name: None for name in (*JOB_FIELDS, "script", "script_args")}
    assert job_options({**values, "nodes": 7}).nodes == 7  # the parameter → the field

    builder = _function(MNCLOUD / "request.py", "_spec_from_options")
    assert "opts: JobOptions" in ast.unparse(builder.args)
    body = [n for stmt in builder.body for n in ast.walk(stmt)]
    assert not [n for n in body if isinstance(n, ast.Subscript | ast.Dict)], (
        "the spec is built from JobOptions' attributes, not from a dict"
    )
    assert _keyword(_call(builder, "JobSpec"), "nodes") == "nodes"
    assert "checked_nodes(_or_default(opts.nodes, 'nodes'))" in ast.unparse(builder)
    assert JobSpec.model_fields["nodes"].default == job_default("nodes")

    from_spec = _function(MNCLOUD / "plan" / "model.py", "from_spec")
    assert _keyword(_call(from_spec, "for_market"), "nodes") == "spec.nodes"

    variables = _function(MNCLOUD / "render" / "__init__.py", "template_variables")
    returned = next(n.value for n in ast.walk(variables) if isinstance(n, ast.Return))
    assert isinstance(returned, ast.Dict)
    entries = {
        ast.literal_eval(k): ast.unparse(v)
        for k, v in zip(returned.keys, returned.values, strict=True)
        if k
    }
    assert entries["num_nodes"] == "spec.nodes"
    template = (MNCLOUD / "templates" / "task.yaml.j2").read_text()
    assert "num_nodes: {{ num_nodes | yaml }}" in template


def test_the_launch_options_are_built_field_by_field_from_the_parameters() -> None:
    """`launch_options_from` names every `LaunchOptions` field once, each from the parameter
    of its name (no `**dict`), and a value said for each arrives in its field."""
    from mncloud.spec.launch import LaunchOptions

    builder = _function(MNCLOUD / "cli" / "values.py", "launch_options_from")
    call = _call(builder, "LaunchOptions")
    assert not call.args
    assert sorted(k.arg or "**" for k in call.keywords) == sorted(LaunchOptions.model_fields)
    for keyword in call.keywords:
        assert ast.unparse(keyword.value).startswith(f"said({keyword.arg!r}"), keyword.arg
    said: dict[str, Any] = {
        "hours": 5.0,
        "learn": True,
        "hazards_from": [Path("t.csv")],
        "minimize": "time",
        "recompute": "full",
        "template": Path("t.j2"),
        "cluster": True,
        "recovery_delay": "30s",
        "chaos_preempt_after": "1m",
        "preflight_always": True,
    }
    numbers = set(LaunchOptions.model_fields) - set(said)
    options = launch_options_from({**said, **{name: 7 for name in numbers}, "yes": True})
    assert {name: getattr(options, name) for name in numbers} == dict.fromkeys(numbers, 7)
    assert (options.hours, options.learn, options.hazards_from) == (5.0, True, (Path("t.csv"),))
    assert (options.minimize.value, options.recompute, options.cluster) == ("time", "full", True)
    assert options.preflight_always is True
    assert (options.template, options.recovery_delay, options.chaos_preempt_after) == (
        Path("t.j2"), 30.0, 60.0)  # fmt: skip
    assert launch_options_from({}) == LaunchOptions()  # a parameter not said: its default


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    found = ((key, getattr(m, key, None)) for m in metadata for key in ("ge", "gt", "le"))
    return {key: value for key, value in found if value is not None}


def test_the_spec_takes_its_defaults_and_bounds_from_the_options_metadata() -> None:
    for name in JOB_FIELDS:
        field = JobSpec.model_fields.get(FIELD_OF.get(name, name))
        if field is None:
            continue
        assert _bounds(field.metadata) == meta(name).bounds(), name
        if meta(name).default is not None:
            assert _text(default_of(name)) == _text(meta(name).default), name
    assert meta("nodes").bounds() == {"ge": MIN_NODES, "le": MAX_NODES}
    assert set(ProjectConfig.model_fields) == set(YAML_KEYS)
    assert FLAG_ONLY == ("allow_secret_env",)
