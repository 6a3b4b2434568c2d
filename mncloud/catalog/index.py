"""The offers index: what `catalog.offers` asks SkyPilot, asked once per catalog file version.

One entry per cloud (`skycache`), built with SkyPilot's own code and nothing of ours:

- `rows`: every GPU row of `sky.catalog.list_accelerators(gpus_only=True, all_regions=True)`
  for the cloud, in SkyPilot's order (cloud, instance type, accelerator, count, prices, region);
- `unsupported`: for every instance type in `rows`, SkyPilot's feature-check verdict
  (`unsupported_reason`) on one node and on several, on-demand and spot;
- `ranks`: SkyPilot's region order for every instance type and market
  (`get_region_zones_for_instance_type`);
- `regions`: the regions of the cloud's `vms.csv` that `validate_region_zone` accepts.

The key is SkyPilot's version, the catalog folder and the size and mtime of every CSV in the
cloud's folder and in `common/`. Building imports SkyPilot; reading does not.

`catalog` reads this index and never the other way round: what both ask SkyPilot live
(`quiet_sky`, `unsupported_reason`) lives here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

from mncloud.catalog import cache as skycache

#: The (nodes > 1, spot) order of an instance type's `unsupported` verdicts.
VERDICTS = [(False, False), (False, True), (True, False), (True, True)]


class Row(NamedTuple):
    """One catalog row, with the fields of SkyPilot's `InstanceTypeInfo` that mncloud reads."""

    cloud: str
    instance_type: str
    accelerator_name: str
    accelerator_count: float
    price: float
    spot_price: float
    region: str
    device_memory: float | None = None
    """GiB per GPU from the catalog's `GpuInfo` (None where SkyPilot cannot read it)."""


Section = dict[str, Any]


def sections(clouds: list[str]) -> dict[str, Section] | None:
    """The index entries for `clouds`, built where stale; None if one cannot be built (a cloud
    SkyPilot has no catalog for, or cannot read): the caller then asks SkyPilot directly."""
    found: dict[str, Section] = {}
    for cloud in clouds:
        section = _section(cloud)
        if section is None:
            return None
        found[cloud] = section
    return found


def rows_for(section: Section, accelerator: str) -> list[Row]:
    """The section's rows for an accelerator name (case-insensitive, as mncloud asks SkyPilot)."""
    wanted = accelerator.lower()
    return [Row(*row) for row in section["rows"] if str(row[2]).lower() == wanted]


def unsupported(section: Section, instance_type: str, spot: bool, nodes: int) -> str | None:
    """SkyPilot's stored feature-check verdict (None: supported)."""
    return section["unsupported"][instance_type][VERDICTS.index((nodes > 1, spot))]


def ranks(section: Section, instance_types: set[str], spot: bool) -> dict[tuple[str, str], int]:
    """SkyPilot's region order for each instance type, as `catalog._region_ranks` returns it."""
    result: dict[tuple[str, str], int] = {}
    for instance_type in instance_types:
        for rank, region in enumerate(section["ranks"][instance_type][int(spot)]):
            result[(instance_type, region)] = rank
    return result


def _entry_name(kind: str) -> str:
    digest = hashlib.sha256(str(skycache.catalog_root()).encode()).hexdigest()[:12]
    return f"{kind}-{digest}.json"


def _section(cloud: str) -> Section | None:
    if not cloud.replace("-", "").replace("_", "").isalnum():
        return None
    try:
        return skycache.cached(
            _entry_name(f"offers2-{cloud}"),
            lambda: [str(skycache.catalog_root()), skycache.files_key(cloud, "common")],
            lambda: _build_section(cloud),
        )
    except _Unbuildable:
        return None


class _Unbuildable(Exception):
    """SkyPilot could not answer for this cloud: not cached, the caller asks it directly."""


def _build_section(cloud: str) -> Section:
    """Ask SkyPilot everything `offers` may ask about `cloud` (imports SkyPilot)."""
    from sky import catalog as sky_catalog

    try:
        with quiet_sky():
            listed = sky_catalog.list_accelerators(
                clouds=[cloud], gpus_only=True, all_regions=True, case_sensitive=False
            )
            rows = [
                [
                    str(info.cloud).lower(),
                    str(info.instance_type),
                    str(info.accelerator_name),
                    info.accelerator_count,
                    float(info.price),
                    float(info.spot_price),
                    str(info.region),
                    _gib(info.device_memory),
                ]
                for infos in listed.values()
                for info in infos
            ]
            instance_types = sorted({row[1] for row in rows})
            verdicts = {
                it: [
                    unsupported_reason(cloud, it, spot, 2 if multi else 1)
                    for multi, spot in VERDICTS
                ]
                for it in instance_types
            }
            region_order = {
                it: [
                    [r.name for r in sky_catalog.get_region_zones_for_instance_type(it, s, cloud)]
                    for s in (False, True)
                ]
                for it in instance_types
            }
            regions = _valid_regions(cloud)
    except Exception as err:  # unknown cloud, unreadable catalog: SkyPilot answers directly
        raise _Unbuildable(str(err)) from err
    return {"rows": rows, "unsupported": verdicts, "ranks": region_order, "regions": regions}


def _gib(value: object) -> float | None:
    """A GPU memory figure as JSON can keep it: NaN (no `GpuInfo`) becomes None."""
    try:
        gib = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if gib != gib else gib


def _valid_regions(cloud: str) -> list[str]:
    """Regions named in the cloud's `vms.csv` that SkyPilot's `validate_region_zone` accepts."""
    from sky.catalog import common as catalog_common
    from sky.utils import registry

    cloud_obj = registry.CLOUD_REGISTRY.from_str(cloud)
    frame = catalog_common.read_catalog(f"{cloud}/vms.csv")
    valid = []
    for region in sorted({str(r) for r in frame["Region"].dropna().unique()}):
        try:
            cloud_obj.validate_region_zone(region, None)
        except ValueError:
            continue
        valid.append(region)
    return valid


def accelerator_names() -> list[str]:
    """SkyPilot's accelerator names (`common/accelerators.csv`), cached like the offers."""
    return skycache.cached(
        _entry_name("accelerators"),
        lambda: [str(skycache.catalog_root()), skycache.files_key("common")],
        _read_accelerator_names,
    )


def _read_accelerator_names() -> list[str]:
    from sky.catalog import common as catalog_common

    with quiet_sky():  # the frame is lazy: reading a column may download it
        frame = catalog_common.read_catalog("common/accelerators.csv")
        return [str(name) for name in frame["AcceleratorName"]]


def region_known(cloud: str, region: str) -> bool | None:
    """True when SkyPilot accepts `region` for `cloud` (by the index); None when the index
    cannot tell (a region it does not list, or a cloud it has no entry for)."""
    section = _section(cloud)
    if section is None or region not in section["regions"]:
        return None
    return True


def cloud_names() -> list[str]:
    """Every cloud name in SkyPilot's registry (`CLOUD_REGISTRY`), cached per SkyPilot version."""
    return skycache.cached("clouds.json", lambda: None, _read_cloud_names)


def _read_cloud_names() -> list[str]:
    from sky.utils import registry

    return sorted(registry.CLOUD_REGISTRY.keys())


@contextlib.contextmanager
def quiet_sky() -> Iterator[None]:
    """Keep SkyPilot's own output (catalog download spinners, its logger) off the terminal.

    Offline, a catalog fetch prints rich markup and a failure line before raising; only
    mncloud's one-line error may reach the user. SkyPilot's handlers hold the process's
    original streams, so the file descriptors themselves point at /dev/null meanwhile.
    """
    from sky import sky_logging

    object_strings()
    with sky_logging.silent(), _descriptors_to_devnull(1, 2):
        yield


def object_strings() -> None:
    """Let pandas read SkyPilot's catalogs as SkyPilot 0.14.1 expects: strings as `object`
    columns. pandas 3 infers its `str` dtype, backed by pyarrow once pyarrow is installed (as
    it is beside `datasets`), and SkyPilot's `list_accelerators_impl` divides GCP's GpuInfo
    memory by 1024.0 on such a column: a TypeError that left GCP out of every plan. For this
    process, and before SkyPilot first reads (and caches) a catalog; a no-op where pandas has
    no such option."""
    import warnings

    import pandas as pd

    with warnings.catch_warnings(), contextlib.suppress(Exception):
        warnings.simplefilter("ignore")  # deprecated in pandas 3 (removed in 4)
        pd.set_option("future.infer_string", False)


@contextlib.contextmanager
def _descriptors_to_devnull(*fds: int) -> Iterator[None]:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: list[tuple[int, int]] = []
    with open(os.devnull, "w") as devnull:
        try:
            for fd in fds:
                with contextlib.suppress(OSError):
                    saved.append((fd, os.dup(fd)))
                    os.dup2(devnull.fileno(), fd)
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)


def unsupported_reason(cloud: str, instance_type: str, spot: bool, nodes: int) -> str | None:
    """SkyPilot's reason why `cloud` cannot run this request, or None if it can.

    Applies the check SkyPilot's optimizer applies: the features the resources need (spot
    among them) plus MULTI_NODE for more than one node, through `check_features_are_supported`.
    """
    import sky
    from sky import exceptions
    from sky.clouds import cloud as cloud_lib
    from sky.utils import registry

    cloud_obj = registry.CLOUD_REGISTRY.from_str(cloud)
    resources = sky.Resources(infra=cloud, instance_type=instance_type, use_spot=spot)
    required = set(resources.get_required_cloud_features())
    if nodes > 1:
        required.add(cloud_lib.CloudImplementationFeatures.MULTI_NODE)
    try:
        cloud_obj.check_features_are_supported(resources, required)
    except exceptions.NotSupportedError:
        pass
    else:
        return None
    # The public check raised; its per-feature reasons are in the cloud's (private) table.
    table = getattr(cloud_obj, "_unsupported_features_for_resources", None)
    reasons = table(resources) if table else {}
    parts = [
        f"{feature.value}: {reasons[feature]}"
        for feature in sorted(required, key=lambda f: f.value)
        if feature in reasons
    ]
    market = "spot" if spot else "on-demand"
    return "; ".join(parts) or f"SkyPilot rejects {market} on {nodes} node(s)"
