"""SkyPilot's price catalog, read through SkyPilot's own catalog code. No prices of our own.

What `offers` asks SkyPilot (its rows, feature checks and region order) is asked once per
catalog file version and kept in the offers index (`catalog_index`, under `$MNCLOUD_HOME`), so a
plan imports SkyPilot only when that index is stale; `MNCLOUD_SKY_CACHE=0` asks SkyPilot always.

Offline use: `MNCLOUD_CATALOG_DIR` (or `--catalog DIR`) names a snapshot laid out as SkyPilot's
`v8/<cloud>/vms.csv` tree. SkyPilot computes its catalog paths when `sky` is first imported,
so `use_catalog_dir` must run before that; it links the snapshot's files into a SkyPilot
runtime folder (`SKY_RUNTIME_DIR`) where SkyPilot finds them and never re-downloads them.

    index.py      the offers index, asked once per catalog file version
    cache.py      SkyPilot's answers kept under `$MNCLOUD_HOME/sky-cache`
    clouds.py     which clouds SkyPilot has enabled (its last `sky check`)
    gpus.py       `mncloud gpus`: the accelerator names `--gpus` takes
    skyconfig.py  SkyPilot's own config files, read without importing SkyPilot
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mncloud import constants, layout
from mncloud.catalog import cache as skycache
from mncloud.catalog import index as catalog_index
from mncloud.catalog.index import quiet_sky, unsupported_reason
from mncloud.errors import CatalogError, SpecError

CATALOG_SCHEMA_VERSION = "v8"
#: How to plan without the network, said wherever SkyPilot's catalog cannot be fetched.
OFFLINE_HELP = (
    f"go online once, or set {constants.CATALOG_DIR_ENV} to a catalog snapshot "
    "(docs: getting-started/install.md, Offline: a catalog snapshot)"
)


def use_catalog_dir(catalog_dir: str | Path | None = None) -> Path | None:
    """Point SkyPilot at an offline catalog snapshot; return the snapshot's v8 folder or None.

    Uses `catalog_dir`, else `$MNCLOUD_CATALOG_DIR`; with neither, SkyPilot fetches its
    catalog itself. Must run before `import sky`. A folder given explicitly is remembered in
    `$MNCLOUD_CATALOG_DIR`, so later calls (and child processes) use the same snapshot.
    """
    chosen = catalog_dir or os.environ.get(constants.CATALOG_DIR_ENV)
    if not chosen:
        return None
    try:
        root = Path(chosen).expanduser().resolve()
        versioned = root if root.name == CATALOG_SCHEMA_VERSION else root / CATALOG_SCHEMA_VERSION
        found = versioned.is_dir()
    except (OSError, RuntimeError):  # a name too long, a symlink loop
        found = False
    if not found:
        raise CatalogError(
            f"catalog folder {str(chosen)!r} has no {CATALOG_SCHEMA_VERSION}/ inside; point it at "
            f"a snapshot laid out as {CATALOG_SCHEMA_VERSION}/<cloud>/vms.csv"
        )
    runtime = os.environ.get("SKY_RUNTIME_DIR")
    if not runtime:
        digest = hashlib.sha256(str(versioned).encode()).hexdigest()[:12]
        runtime = str(layout.sky_runtime_dir(digest))
        if "sky" in sys.modules:
            raise CatalogError(
                "the catalog folder must be chosen before SkyPilot is imported; "
                f"set {constants.CATALOG_DIR_ENV} in the environment instead"
            )
        os.environ["SKY_RUNTIME_DIR"] = runtime
    os.environ[constants.CATALOG_DIR_ENV] = str(root)
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
    """Every accelerator name SkyPilot's catalog knows (`common/accelerators.csv`).

    From the offers index (`catalog_index`) unless it is stale or `MNCLOUD_SKY_CACHE=0`.
    """
    use_catalog_dir()
    try:
        if skycache.enabled():
            return catalog_index.accelerator_names()
        return catalog_index._read_accelerator_names()
    except Exception as err:  # SkyPilot raises requests/OSError types when offline
        raise CatalogError(
            f"cannot read SkyPilot's accelerator list ({err.__class__.__name__}); {OFFLINE_HELP}"
        ) from None


def canonical_accelerator(name: str) -> str:
    """SkyPilot's spelling of an accelerator name, matched case-insensitively like SkyPilot."""
    known = accelerator_names()
    by_lower = {k.lower(): k for k in known}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.5)
    names = ", ".join(by_lower[c] for c in close)
    hint = (
        f"did you mean {names}? (`mncloud gpus` lists them)"
        if close
        else "`mncloud gpus` lists them"
    )
    raise SpecError(f"--gpus {name!r}: SkyPilot knows no accelerator of that name; {hint}")


#: Clouds in SkyPilot's registry that have no public price list (they price at 0 or not at all).
_UNPRICED_CLOUDS = frozenset({"kubernetes", "ssh", "slurm", "vsphere"})


class Offer(BaseModel):
    """One way to rent a node: an instance type in a region, spot or on-demand, at its price."""

    model_config = ConfigDict(frozen=True)

    cloud: str
    """SkyPilot's registry name, lower case (`aws`, `lambda`)."""
    region: str
    instance_type: str
    accelerator: str
    """Canonical accelerator name as the catalog spells it."""
    accelerator_count: int
    spot: bool
    hourly_price: float
    """USD per node-hour: the lowest price of the instance type among the region's zones."""
    region_rank: int = 0
    """SkyPilot's own order of preference for this instance type's regions (0 = tried first)."""
    gpu_memory_gib: float | None = None
    """Memory per GPU, where SkyPilot's catalog knows it (its `GpuInfo` column)."""


class Exclusion(BaseModel):
    """A cloud (or its spot market) left out of a search, and why."""

    model_config = ConfigDict(frozen=True)

    cloud: str
    reason: str


class OfferSearch(BaseModel):
    """The result of `offers`: what fits, and which clouds were left out and why."""

    offers: list[Offer]
    excluded: list[Exclusion] = Field(default_factory=list)
    clouds: list[str] = Field(default_factory=list)
    """The clouds searched."""


def snapshot_clouds(versioned: Path) -> list[str]:
    """Clouds with a `vms.csv` in a catalog snapshot's version folder."""
    return sorted(p.parent.name for p in versioned.glob("*/vms.csv"))


def default_clouds() -> list[str]:
    """The clouds to search when the request names none.

    With a catalog snapshot (offline): the clouds it holds. Online: the clouds SkyPilot found
    credentials for at its last `sky check`, else every cloud SkyPilot prices.
    """
    versioned = use_catalog_dir()
    if versioned is not None:
        return snapshot_clouds(versioned)
    from sky import global_user_state, skypilot_config
    from sky.clouds import cloud as cloud_lib
    from sky.skylet import constants as sky_constants

    try:
        enabled = global_user_state.get_cached_enabled_clouds(
            cloud_lib.CloudCapability.COMPUTE, skypilot_config.get_active_workspace()
        )
    except Exception:  # a broken or foreign state database: fall back to every cloud
        enabled = []
    names = [str(c).lower() for c in enabled] or list(sky_constants.ALL_CLOUDS)
    return [n for n in names if n not in _UNPRICED_CLOUDS]


def offers(
    accelerator: str,
    count: int,
    *,
    clouds: Sequence[str] = (),
    regions: Sequence[str] = (),
    use_spot: bool | None = None,
    nodes: int = 1,
) -> OfferSearch:
    """Every (cloud, region, instance type, spot) offering exactly `count` × `accelerator`.

    Prices come from `sky.catalog.list_accelerators`; `use_spot` None means both markets. A
    cloud is left out, with SkyPilot's reason, when SkyPilot's own feature check
    (`Cloud.check_features_are_supported`, the test its optimizer applies) rejects multi-node
    (for `nodes` > 1) or spot; a missing (NaN) spot price means no spot offer. Raises
    CatalogError, listing what the catalog does offer for the accelerator, when nothing fits.
    """
    use_catalog_dir()
    searched = [c.lower() for c in clouds] or default_clouds()
    source = _source(searched)
    found, excluded = source.rows(accelerator, searched)
    wanted_regions = {r.lower() for r in regions}
    markets = [False, True] if use_spot is None else [use_spot]
    result: list[Offer] = []
    for cloud in searched:
        rows = [
            info
            for info in found.get(cloud, [])
            if int(info.accelerator_count) == count
            and (not wanted_regions or str(info.region).lower() in wanted_regions)
        ]
        for spot in markets if rows else []:
            result.extend(
                _market_offers(source, cloud, rows, spot, nodes, excluded, f"{accelerator}:{count}")
            )
    if not result:
        everywhere = found
        if clouds:  # say what the other clouds offer too
            extra = [c for c in default_clouds() if c not in searched]
            if extra:
                everywhere = {**_source(extra).rows(accelerator, extra)[0], **found}
        message = _no_offer_message(accelerator, count, searched, regions, found, excluded)
        raise CatalogError(message + _availability_note(accelerator, searched, everywhere))
    return OfferSearch(offers=result, excluded=excluded, clouds=searched)


def _market_offers(
    source: _LiveSource | _IndexSource,
    cloud: str,
    rows: list[Any],
    spot: bool,
    nodes: int,
    excluded: list[Exclusion],
    wanted: str,
) -> list[Offer]:
    """One cloud's offers of `wanted` (e.g. `H100:8`) in one market; why there are none goes
    into `excluded`."""
    reason = source.unsupported(cloud, rows[0].instance_type, spot, nodes)
    if reason:
        if Exclusion(cloud=cloud, reason=reason) not in excluded:
            excluded.append(Exclusion(cloud=cloud, reason=reason))
        return []
    priced = [
        (info, float(info.spot_price if spot else info.price))
        for info in rows
        if not math.isnan(float(info.spot_price if spot else info.price))
    ]
    if not priced:
        reason = f"SkyPilot's catalog has no {_market(spot)} price for {wanted}"
        excluded.append(Exclusion(cloud=cloud, reason=reason))
        return []
    ranks = source.ranks(cloud, {info.instance_type for info, _ in priced}, spot)
    return [
        Offer(
            cloud=cloud,
            region=str(info.region),
            instance_type=str(info.instance_type),
            accelerator=str(info.accelerator_name),
            accelerator_count=int(info.accelerator_count),
            spot=spot,
            hourly_price=price,
            region_rank=ranks.get((str(info.instance_type), str(info.region)), 0),
            gpu_memory_gib=_gib(getattr(info, "device_memory", None)),
        )
        for info, price in priced
    ]


def _gib(value: Any) -> float | None:
    """SkyPilot's GPU memory figure (GiB), or None where its catalog has none (NaN)."""
    try:
        gib = float(value)
    except (TypeError, ValueError):
        return None
    return gib if gib > 0 and not math.isnan(gib) else None


class _LiveSource:
    """Answers straight from SkyPilot (imports it)."""

    def rows(
        self, accelerator: str, clouds: list[str]
    ) -> tuple[dict[str, list[Any]], list[Exclusion]]:
        return _list_accelerator(accelerator, clouds)

    def unsupported(self, cloud: str, instance_type: str, spot: bool, nodes: int) -> str | None:
        return unsupported_reason(cloud, instance_type, spot, nodes)

    def ranks(self, cloud: str, instance_types: set[str], spot: bool) -> dict[tuple[str, str], int]:
        return _region_ranks(cloud, instance_types, spot)


class _IndexSource:
    """The same answers from the offers index (`catalog_index`): no SkyPilot import."""

    def __init__(self, sections: dict[str, Any]) -> None:
        self.sections = sections

    def rows(
        self, accelerator: str, clouds: list[str]
    ) -> tuple[dict[str, list[Any]], list[Exclusion]]:
        by_cloud: dict[str, list[Any]] = {}
        for cloud in clouds:
            for row in catalog_index.rows_for(self.sections[cloud], accelerator):
                by_cloud.setdefault(row.cloud, []).append(row)
        return by_cloud, []

    def unsupported(self, cloud: str, instance_type: str, spot: bool, nodes: int) -> str | None:
        return catalog_index.unsupported(self.sections[cloud], instance_type, spot, nodes)

    def ranks(self, cloud: str, instance_types: set[str], spot: bool) -> dict[tuple[str, str], int]:
        return catalog_index.ranks(self.sections[cloud], instance_types, spot)


def _source(clouds: list[str]) -> _LiveSource | _IndexSource:
    """The offers index if every cloud in `clouds` has a fresh (or rebuilt) entry; else SkyPilot."""
    if skycache.enabled():
        sections = catalog_index.sections(clouds)
        if sections is not None:
            return _IndexSource(sections)
    return _LiveSource()


def _market(spot: bool) -> str:
    return "spot" if spot else "on-demand"


def _list_accelerator(
    accelerator: str, clouds: list[str]
) -> tuple[dict[str, list[Any]], list[Exclusion]]:
    """SkyPilot's catalog rows for one accelerator name, by cloud; clouds it cannot read."""
    from sky import catalog as sky_catalog

    kwargs = {
        "gpus_only": True,
        "name_filter": f"^{re.escape(accelerator)}$",
        "all_regions": True,
        "case_sensitive": False,
    }
    excluded: list[Exclusion] = []
    with quiet_sky():
        return _list_rows(sky_catalog, clouds, kwargs, excluded)


def _list_rows(
    sky_catalog: Any, clouds: list[str], kwargs: dict[str, Any], excluded: list[Exclusion]
) -> tuple[dict[str, list[Any]], list[Exclusion]]:
    try:
        listed = sky_catalog.list_accelerators(clouds=clouds, **kwargs)
        rows = [info for infos in listed.values() for info in infos]
    except Exception:  # one unreadable catalog fails the batch: retry cloud by cloud
        rows = []
        for cloud in clouds:
            try:
                listed = sky_catalog.list_accelerators(clouds=[cloud], **kwargs)
            except ValueError as err:  # SkyPilot has no catalog module of that name
                excluded.append(Exclusion(cloud=cloud, reason=str(err)))
                continue
            except Exception as err:  # requests/OSError/pandas errors when offline
                excluded.append(
                    Exclusion(
                        cloud=cloud,
                        reason=f"SkyPilot's catalog for {cloud} is unavailable "
                        f"({err.__class__.__name__}); {OFFLINE_HELP}",
                    )
                )
                continue
            rows.extend(info for infos in listed.values() for info in infos)
    by_cloud: dict[str, list[Any]] = {}
    for info in rows:
        by_cloud.setdefault(str(info.cloud).lower(), []).append(info)
    return by_cloud, excluded


def _region_ranks(cloud: str, instance_types: set[str], spot: bool) -> dict[tuple[str, str], int]:
    """SkyPilot's region order for each instance type (price, then its own preference)."""
    from sky import catalog as sky_catalog

    ranks: dict[tuple[str, str], int] = {}
    for instance_type in instance_types:
        regions = sky_catalog.get_region_zones_for_instance_type(instance_type, spot, clouds=cloud)
        for rank, region in enumerate(regions):
            ranks[(instance_type, region.name)] = rank
    return ranks


def _no_offer_message(
    accelerator: str,
    count: int,
    clouds: list[str],
    regions: Sequence[str],
    found: dict[str, list[Any]],
    excluded: list[Exclusion],
) -> str:
    where = f" on {', '.join(clouds)}" + (f" in {', '.join(regions)}" if regions else "")
    del found
    if excluded:
        reasons = "; ".join(f"{e.cloud}: {e.reason}" for e in excluded)
        return f"no cloud can serve {accelerator}:{count}{where} ({reasons})"
    return f"no offer for {accelerator}:{count}{where}"


def _availability_note(accelerator: str, clouds: list[str], found: dict[str, list[Any]]) -> str:
    """`. Available for H100: H100:1 on gcp, lambda; H100:8 on aws, gcp, lambda`."""
    available = _availability(found)
    if available:
        return f". Available for {accelerator} (any region): {available}"
    return f". SkyPilot's catalog lists no {accelerator} on {', '.join(clouds)}"


def _availability(found: dict[str, list[Any]]) -> str:
    by_count: dict[tuple[str, int], set[str]] = {}
    for cloud, rows in found.items():
        for info in rows:
            key = (str(info.accelerator_name), int(info.accelerator_count))
            by_count.setdefault(key, set()).add(cloud)
    return "; ".join(
        f"{name}:{count} on {', '.join(sorted(clouds))}"
        for (name, count), clouds in sorted(by_count.items(), key=lambda kv: kv[0][1])
    )
