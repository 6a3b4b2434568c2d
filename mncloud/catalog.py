"""SkyPilot's price catalog, read through SkyPilot's own catalog code. No prices of our own.

Offline use: `MNCLOUD_CATALOG_DIR` (or `--catalog DIR`) names a snapshot laid out as SkyPilot's
`v8/<cloud>/vms.csv` tree. SkyPilot computes its catalog paths when `sky` is first imported,
so `use_catalog_dir` must run before that; it links the snapshot's files into a SkyPilot
runtime folder (`SKY_RUNTIME_DIR`) where SkyPilot finds them and never re-downloads them.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import sys
from pathlib import Path

from mncloud import constants
from mncloud.errors import CatalogError, SpecError

CATALOG_SCHEMA_VERSION = "v8"


def mncloud_home() -> Path:
    """mncloud's own state folder: `$MNCLOUD_HOME` or `~/.mncloud`."""
    return Path(os.environ.get(constants.HOME_ENV) or Path.home() / ".mncloud").expanduser()


def use_catalog_dir(catalog_dir: str | Path | None = None) -> Path | None:
    """Point SkyPilot at an offline catalog snapshot; return the snapshot's v8 folder or None.

    Uses `catalog_dir`, else `$MNCLOUD_CATALOG_DIR`; with neither, SkyPilot fetches its
    catalog itself. Must run before `import sky`.
    """
    chosen = catalog_dir or os.environ.get(constants.CATALOG_DIR_ENV)
    if not chosen:
        return None
    root = Path(chosen).expanduser().resolve()
    versioned = root if root.name == CATALOG_SCHEMA_VERSION else root / CATALOG_SCHEMA_VERSION
    if not versioned.is_dir():
        raise CatalogError(
            f"catalog folder {str(chosen)!r} has no {CATALOG_SCHEMA_VERSION}/ inside; point it at "
            f"a snapshot laid out as {CATALOG_SCHEMA_VERSION}/<cloud>/vms.csv"
        )
    runtime = os.environ.get("SKY_RUNTIME_DIR")
    if not runtime:
        digest = hashlib.sha256(str(versioned).encode()).hexdigest()[:12]
        runtime = str(mncloud_home() / "sky-runtime" / digest)
        if "sky" in sys.modules:
            raise CatalogError(
                "the catalog folder must be chosen before SkyPilot is imported; "
                f"set {constants.CATALOG_DIR_ENV} in the environment instead"
            )
        os.environ["SKY_RUNTIME_DIR"] = runtime
    target = Path(runtime) / ".sky" / "catalogs" / CATALOG_SCHEMA_VERSION
    for csv in versioned.rglob("*.csv"):
        link = target / csv.relative_to(versioned)
        if link.is_symlink() and link.resolve() == csv.resolve():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(csv)
    os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    return versioned


def accelerator_names() -> list[str]:
    """Every accelerator name SkyPilot's catalog knows (`common/accelerators.csv`)."""
    use_catalog_dir()
    from sky.catalog import common as catalog_common

    try:
        frame = catalog_common.read_catalog("common/accelerators.csv")
        return [str(name) for name in frame["AcceleratorName"]]
    except Exception as err:  # SkyPilot raises requests/OSError types when offline
        raise CatalogError(
            f"cannot read SkyPilot's accelerator list ({err.__class__.__name__}); go online once, "
            f"or set {constants.CATALOG_DIR_ENV} to a catalog snapshot"
        ) from None


def canonical_accelerator(name: str) -> str:
    """SkyPilot's spelling of an accelerator name, matched case-insensitively like SkyPilot."""
    known = accelerator_names()
    by_lower = {k.lower(): k for k in known}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.upper(), known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see `sky show-gpus` for the names"
    raise SpecError(f"--gpus {name!r}: SkyPilot knows no accelerator of that name; {hint}")
