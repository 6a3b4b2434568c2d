"""Each job option's default is stated once, by its `JobSpec` field, and everything else comes
to it: the CLI's options (which default to None, so `mncloud.yaml` can fill them), the help text,
`mncloud.yaml`'s keys (`ProjectConfig`, all None) and `build_spec` when neither says a value.
So a new job option is a decision: a field, a `ProjectConfig` key or a `FLAG_ONLY` entry."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer.main

from mncloud.cli import app
from mncloud.cli.options import JOB, MARKET
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
