"""Backends by name, and which backend owns each run.

A backend registers under a name with the dotted path of its class, so nothing is imported
until a run needs it (SkyPilot alone takes seconds to import) and no backend module imports
this one back: `base.py` is the interface, this is the table, the engines sit beside them.

Every run, whichever engine, has a folder `$MNCLOUD_HOME/runs/<name>/` holding `backend.json`,
so `status`, `logs` and `down` find the engine of a run by its name.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mncloud import layout
from mncloud.errors import BackendError, RunNotFoundError

if TYPE_CHECKING:
    from mncloud.backends.base import Backend

BACKEND_FILE = "backend.json"

_REGISTRY: dict[str, str] = {
    "local": "mncloud.backends.local:LocalBackend",
    "skypilot": "mncloud.backends.skypilot:SkyPilotBackend",
}


def get_backend(name: str) -> Backend:
    """The backend called `name`, imported only when asked for."""
    target = _REGISTRY.get(name)
    if target is None:
        raise BackendError(f"unknown backend {name!r}; use one of {', '.join(sorted(_REGISTRY))}")
    module_name, _, class_name = target.partition(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class()  # type: ignore[no-any-return]


def backend_names() -> list[str]:
    """Every registered backend's name, in the order they were registered."""
    return list(_REGISTRY)


def record_backend(run_name: str, backend: str, extra: dict[str, Any] | None = None) -> Path:
    """Remember which backend owns a run (written before launching)."""
    folder = layout.run_dir(run_name)
    folder.mkdir(parents=True, exist_ok=True)
    data = {"backend": backend, "name": run_name, "created_at": time.time(), **(extra or {})}
    (folder / BACKEND_FILE).write_text(json.dumps(data, indent=2))
    return folder


def backend_name_of(run_name: str) -> str:
    """Which backend owns `run_name`; RunNotFoundError with the known names otherwise."""
    path = layout.run_dir(run_name) / BACKEND_FILE
    if not path.is_file():
        known = ", ".join(known_runs()) or "none yet"
        raise RunNotFoundError(f"no run named {run_name!r} (known runs: {known})")
    return str(json.loads(path.read_text())["backend"])


def known_runs() -> list[str]:
    """Names of every run this machine launched, oldest first."""
    root = layout.runs_root()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if (p / BACKEND_FILE).is_file()]
    return [p.name for p in sorted(found, key=lambda p: (p / BACKEND_FILE).stat().st_mtime)]


def backend_for_run(run_name: str) -> Backend:
    """The backend that owns `run_name`."""
    return get_backend(backend_name_of(run_name))
