"""Which clouds SkyPilot has enabled: what its last `sky check` recorded on this machine.

`sky check` writes the clouds it found credentials for into SkyPilot's state database
(`$SKY_RUNTIME_DIR/.sky/state.db`, `~` without the variable); nothing else enables a cloud. So:

- no database: `sky check` never ran here, so no cloud is enabled (answered without SkyPilot);
- a database: SkyPilot reads it (`global_user_state.get_cached_enabled_clouds`), and the answer
  is kept in `skycache` under the database's size and mtime, so the next command need not
  import SkyPilot until `sky check` writes it again;
- state kept elsewhere (a remote API server, a Postgres database): unknown (None), and callers
  change nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mncloud.catalog import cache as skycache

#: SkyPilot's variables that put its state somewhere other than this machine's state.db.
_ELSEWHERE_ENV = ("SKYPILOT_DB_CONNECTION_URI", "SKYPILOT_API_SERVER_ENDPOINT")
_LOCAL_HOSTS = ("//127.0.0.1", "//localhost", "//0.0.0.0", "//[::1]")


def state_db() -> Path:
    """SkyPilot's state database, computed as SkyPilot computes it (at call time here)."""
    runtime = os.path.expanduser(os.environ.get("SKY_RUNTIME_DIR", "~"))
    return Path(runtime) / ".sky" / "state.db"


def enabled_clouds() -> list[str] | None:
    """The compute clouds SkyPilot has enabled, lower case ([] for none); None when SkyPilot
    keeps its state elsewhere or its database cannot be read."""
    if _state_elsewhere():
        return None
    path = state_db()
    if not path.exists():
        return []
    return skycache.cached("enabled-clouds", lambda: _db_key(path), _ask_skypilot)


def _db_key(path: Path) -> list[Any]:
    """The database and its write-ahead log, by size and mtime: `sky check` changes one."""
    key: list[Any] = [str(path)]
    for part in (path, path.with_name(path.name + "-wal")):
        try:
            stat = part.stat()
        except OSError:
            key.append(None)
            continue
        key.append([stat.st_size, stat.st_mtime_ns])
    return key


def _ask_skypilot() -> list[str] | None:
    try:
        from sky import global_user_state, skypilot_config
        from sky.clouds import cloud as cloud_lib

        enabled = global_user_state.get_cached_enabled_clouds(
            cloud_lib.CloudCapability.COMPUTE, skypilot_config.get_active_workspace()
        )
    except Exception:  # a broken or foreign database: unknown, so nothing changes
        return None
    return sorted(str(c).lower() for c in enabled)


def _state_elsewhere() -> bool:
    """A remote API server or a Postgres database holds SkyPilot's state, not this machine."""
    for name in _ELSEWHERE_ENV:
        value = os.environ.get(name, "").strip()
        if value and not (name.endswith("ENDPOINT") and value.startswith(_local_prefixes())):
            return True
    return _config_endpoint_is_remote()


def _local_prefixes() -> tuple[str, ...]:
    return tuple(f"{scheme}:{host}" for scheme in ("http", "https") for host in _LOCAL_HOSTS)


def _config_endpoint_is_remote() -> bool:
    """`api_server.endpoint` in SkyPilot's user config names another machine."""
    import yaml

    path = Path(os.path.expanduser(os.environ.get("SKYPILOT_CONFIG", "~/.sky/config.yaml")))
    try:
        config = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return False
    server = config.get("api_server") if isinstance(config, dict) else None
    endpoint = server.get("endpoint") if isinstance(server, dict) else None
    return isinstance(endpoint, str) and not endpoint.strip().startswith(_local_prefixes())
