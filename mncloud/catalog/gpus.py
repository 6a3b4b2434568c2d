"""`mncloud gpus`: the accelerator names `--gpus` takes, from SkyPilot's catalog as `plan` reads it.

One `GpuListing` per accelerator name and count per node, with the clouds that offer it and
the cheapest on-demand and spot price of one node. The rows are the offers index's
(`catalog_index.sections`, SkyPilot's own `list_accelerators` rows, cached per catalog
version); a cloud without an index entry is asked directly, as `catalog.offers` does.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from mncloud import catalog
from mncloud.catalog import cache as skycache
from mncloud.catalog import index as catalog_index
from mncloud.catalog.index import Row, quiet_sky
from mncloud.errors import CatalogError, SpecError


class GpuListing(BaseModel):
    """One accelerator at one count per node, as `mncloud gpus` shows it."""

    accelerator: str
    """SkyPilot's spelling: what `--gpus NAME:COUNT` takes."""
    count: int
    """Accelerators per node."""
    clouds: list[str] = Field(default_factory=list)
    on_demand: float | None = None
    """Cheapest on-demand USD per node-hour (any region), None when none is priced."""
    on_demand_cloud: str | None = None
    spot: float | None = None
    """Cheapest spot USD per node-hour (any region), None when no spot is priced."""
    spot_cloud: str | None = None


def list_gpus(name_filter: str | None = None, clouds: Sequence[str] = ()) -> list[GpuListing]:
    """Every accelerator and count per node the catalog prices on `clouds` (default: the
    clouds `plan` searches), by name then count; only names containing `name_filter`
    (case-insensitive). SpecError when the filter matches no name, with the nearest ones."""
    catalog.use_catalog_dir()
    searched = list(clouds) or catalog.default_clouds()
    rows = [row for cloud in searched for row in _rows(cloud)]
    if name_filter:
        wanted = name_filter.strip().lower()
        matched = [r for r in rows if wanted in r.accelerator_name.lower()]
        if not matched:
            raise SpecError(_no_match(name_filter, rows, searched))
        rows = matched
    listings: dict[tuple[str, int], GpuListing] = {}
    for row in rows:
        count = row.accelerator_count
        if not math.isfinite(count) or count < 1 or count != int(count):
            continue  # fractional GPUs (a share of one) are not a `--gpus` count
        key = (row.accelerator_name, int(count))
        listing = listings.setdefault(key, GpuListing(accelerator=key[0], count=key[1]))
        _add(listing, row)
    return [listings[k] for k in sorted(listings, key=lambda k: (k[0].lower(), k[1]))]


def _add(listing: GpuListing, row: Row) -> None:
    if row.cloud not in listing.clouds:
        listing.clouds = sorted([*listing.clouds, row.cloud])
    if _priced(row.price) and (listing.on_demand is None or row.price < listing.on_demand):
        listing.on_demand, listing.on_demand_cloud = row.price, row.cloud
    if _priced(row.spot_price) and (listing.spot is None or row.spot_price < listing.spot):
        listing.spot, listing.spot_cloud = row.spot_price, row.cloud


def _priced(price: float) -> bool:
    return math.isfinite(price) and price > 0


def _no_match(name_filter: str, rows: list[Row], clouds: list[str]) -> str:
    names = sorted({r.accelerator_name for r in rows})
    close = difflib.get_close_matches(name_filter.strip().upper(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "`mncloud gpus` lists them all"
    return f"no accelerator named like {name_filter!r} on {', '.join(clouds)}; {hint}"


def _rows(cloud: str) -> list[Row]:
    """The cloud's GPU rows: the offers index's, else SkyPilot's directly."""
    section = None
    if skycache.enabled():
        found = catalog_index.sections([cloud])
        section = found[cloud] if found else None
    if section is not None:
        return [Row(*row) for row in section["rows"]]
    return _live_rows(cloud)


def _live_rows(cloud: str) -> list[Row]:
    from sky import catalog as sky_catalog

    try:
        with quiet_sky():
            listed: dict[str, list[Any]] = sky_catalog.list_accelerators(
                clouds=[cloud], gpus_only=True, all_regions=True, case_sensitive=False
            )
    except Exception as err:  # requests/OSError/pandas errors when offline
        raise CatalogError(
            f"SkyPilot's catalog for {cloud} is unavailable ({type(err).__name__}); "
            f"{catalog.OFFLINE_HELP}"
        ) from None
    return [
        Row(
            str(i.cloud).lower(), str(i.instance_type), str(i.accelerator_name),
            float(i.accelerator_count), float(i.price), float(i.spot_price), str(i.region),
        )
        for infos in listed.values()
        for i in infos
    ]  # fmt: skip
