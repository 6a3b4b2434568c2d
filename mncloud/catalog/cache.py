"""Answers read from SkyPilot once and kept under `$MNCLOUD_HOME/sky-cache`, so `plan` and
`render` need not import SkyPilot (seconds) on every run.

Each entry is one JSON file holding a key and a value. The key names everything the value was
computed from: SkyPilot's version and, for catalog answers, each catalog file's size and mtime.
A key that no longer matches means the entry is stale: the caller's `build` (which imports
SkyPilot) runs again and the entry is rewritten. Set `MNCLOUD_SKY_CACHE=0` to bypass the cache
entirely (every answer straight from SkyPilot).

SkyPilot re-downloads a catalog file it fetched itself (a `.meta/<file>.md5` beside it) once it
is older than its pull frequency; an entry built from such a file goes stale at that moment too,
so the next build lets SkyPilot refresh it as it would have.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from mncloud import layout

CACHE_ENV = "MNCLOUD_SKY_CACHE"
#: Bumped whenever the shape of a stored value changes.
FORMAT = 1
#: SkyPilot's catalog pull frequency (`_PULL_FREQUENCY_HOURS` in its catalog modules).
PULL_FREQUENCY_HOURS = 7
CATALOG_SCHEMA_VERSION = "v8"

T = TypeVar("T")
#: Values built or loaded in this process, by (entry name, key): a new `$MNCLOUD_HOME` in the
#: same process (tests) gets the entry written without asking SkyPilot again.
_memo: dict[tuple[str, str], Any] = {}


def enabled() -> bool:
    """Whether answers may come from the cache (`MNCLOUD_SKY_CACHE=0` turns it off)."""
    return os.environ.get(CACHE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@cache
def sky_version() -> str:
    """SkyPilot's installed version and the location of its package, without importing it."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("sky")
    origin = spec.origin if spec and spec.origin else ""
    try:
        version = importlib.metadata.version("skypilot")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    stamp = os.stat(origin).st_mtime_ns if origin else 0
    return f"{version}@{origin}:{stamp}"


def catalog_root() -> Path:
    """SkyPilot's versioned catalog folder, computed as SkyPilot computes it at import."""
    runtime = os.path.expanduser(os.environ.get("SKY_RUNTIME_DIR", "~"))
    return Path(runtime) / ".sky" / "catalogs" / CATALOG_SCHEMA_VERSION


def files_key(*folders: str) -> list[list[Any]]:
    """Name, size and mtime of every catalog CSV in `folders` (relative to `catalog_root`),
    plus whether SkyPilot is due to re-download it (see the module docstring)."""
    root = catalog_root()
    entries: list[list[Any]] = []
    for folder in folders:
        directory = root / folder
        if not directory.is_dir():
            entries.append([folder, "missing"])
            continue
        for path in sorted(directory.glob("*.csv")):
            try:
                stat = path.stat()  # follows the links use_catalog_dir makes
            except OSError:
                entries.append([f"{folder}/{path.name}", "unreadable"])
                continue
            due = (root / ".meta" / folder / f"{path.name}.md5").exists() and (
                stat.st_mtime + PULL_FREQUENCY_HOURS * 3600 < time.time()
            )
            entries.append([f"{folder}/{path.name}", stat.st_size, stat.st_mtime_ns, due])
    return entries


def cached(name: str, key: Callable[[], Any], build: Callable[[], T]) -> T:
    """The value stored as `name` if its key still matches `key()`; else `build()`, stored.

    `key` is called again after `build` (building may download or refresh catalog files).
    """
    wanted = json.dumps([FORMAT, sky_version(), key()], sort_keys=True)
    memo_id = (name, wanted)
    if memo_id in _memo:
        value = _memo[memo_id]
        path = layout.sky_cache_dir() / name
        if not path.exists():
            _store(path, wanted, value)
        return value
    path = layout.sky_cache_dir() / name
    stored = _load(path)
    if stored is not None and stored.get("key") == wanted:
        _memo[memo_id] = stored["value"]
        return stored["value"]
    value = build()
    wanted = json.dumps([FORMAT, sky_version(), key()], sort_keys=True)
    _memo[(name, wanted)] = value
    _store(path, wanted, value)
    return value


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _store(path: Path, key: str, value: Any) -> None:
    """Write atomically (a reader sees the old entry or the new one, never half of one)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as out:
            json.dump({"key": key, "value": value}, out)
        os.replace(tmp, path)
    except OSError:  # a read-only home: answers still come, just not cached
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)
