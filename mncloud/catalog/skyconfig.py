"""SkyPilot's own config files, read the way SkyPilot layers them, without importing SkyPilot.

SkyPilot 0.14.1 (`sky/skypilot_config.py`) reads `$SKYPILOT_CONFIG` when set (its internal
override, the whole config); otherwise the user's file (`$SKYPILOT_GLOBAL_CONFIG`, else
`~/.sky/config.yaml`) with the project's (`$SKYPILOT_PROJECT_CONFIG`, else `./.sky.yaml`)
laid over it. mncloud asks it one thing so far: whether SkyPilot may give an AWS VM every EFA
card (`aws.use_internal_ips`; with public IPs it attaches one), which both the planner's
step time and the preflight's expected bandwidth need.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def _read(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _overlay(merged[key], value)
        else:
            merged[key] = value
    return merged


def config() -> dict[str, Any]:
    """SkyPilot's effective config on this machine ({} without one)."""
    if os.environ.get("SKYPILOT_CONFIG"):
        return _read(os.environ["SKYPILOT_CONFIG"])
    user = _read(os.environ.get("SKYPILOT_GLOBAL_CONFIG") or "~/.sky/config.yaml")
    project = _read(os.environ.get("SKYPILOT_PROJECT_CONFIG") or ".sky.yaml")
    return _overlay(user, project)


def aws_all_efa_cards() -> bool:
    """Whether SkyPilot attaches every EFA card to an AWS VM (`aws.use_internal_ips: true`)."""
    aws = config().get("aws")
    return bool(isinstance(aws, dict) and aws.get("use_internal_ips"))
