"""`up --deadline` across places: the places a request names, checked and priced once.

- **Local rehearsal**: `--spot-trace` once per place. A place is named by its trace's file
  stem (`a.json` → `a`); the traces must share one clock (the same gap).
- **Clouds**: `--region` given twice or more (each region a place), else `--cloud` given twice
  or more (each cloud a place). Each place is looked up in SkyPilot's catalog on its own
  (`catalog.offers` for the spec narrowed to it, spot): a place with no spot offer for the
  hardware is refused with the catalog's own message (what it does offer), as `plan` does;
  its spot price is the cheapest there. The first place is home: on-demand runs there, at
  its cheapest on-demand price.

`--spot-price` is given once (every place) or once per place; any other count is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mncloud.control.state import PlaceConfig
from mncloud.errors import SpecError

if TYPE_CHECKING:
    from mncloud.catalog import Offer
    from mncloud.spec import JobSpec


def per_place(given: Sequence[float], k: int, what: str) -> list[float | None]:
    """`--spot-price` for each of `k` places: none, once for all, or once per place."""
    if not given:
        return [None] * k
    if len(given) == 1:
        return [given[0]] * k
    if len(given) == k:
        return list(given)
    places = "place" if k == 1 else "places"
    raise SpecError(
        f"--spot-price given {len(given)} times for {k} {places} ({what}): give it once, "
        "or once per place"
    )


def local_places(
    traces: Sequence[Path], prices: Sequence[float], default_price: float
) -> tuple[tuple[PlaceConfig, ...], int]:
    """The places of a local rehearsal, one per trace, and their common gap (seconds)."""
    from mncloud.plan.traces import load_trace

    loaded = [load_trace(path) for path in traces]
    gaps = sorted({t.gap for t in loaded})
    if len(gaps) > 1:
        raise SpecError(
            f"--spot-trace: the traces tick every {', '.join(f'{g} s' for g in gaps)}; places "
            "share one clock, so give traces of the same gap_seconds"
        )
    names = [Path(path).stem for path in traces]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecError(
            f"--spot-trace: two traces are named {twice[0]!r}; a place is named by its "
            "trace's file name, so rename one"
        )
    spot = per_place(prices, len(traces), f"{len(traces)} --spot-trace")
    places = tuple(
        PlaceConfig(
            name=name,
            cloud="local",
            region=name,
            spot_price=default_price if price is None else price,
            trace=str(Path(path).resolve()),
        )
        for name, path, price in zip(names, traces, spot, strict=True)
    )
    return places, gaps[0]


def cloud_places(spec: JobSpec, prices: Sequence[float]) -> tuple[PlaceConfig, ...]:
    """The places of a cloud request (see the module docstring); () for one place."""
    if len(spec.regions) >= 2:
        pins = [{"regions": [r]} for r in spec.regions]
        names, what = list(spec.regions), f"{len(spec.regions)} --region"
    elif len(spec.clouds) >= 2:
        pins = [{"clouds": [c]} for c in spec.clouds]
        names, what = list(spec.clouds), f"{len(spec.clouds)} --cloud"
    else:
        return ()
    given = per_place(prices, len(pins), what)
    launch_cost = launch_costs(spec)
    places = []
    for name, pin, price in zip(names, pins, given, strict=True):
        pinned = spec.updated(**pin)
        cheapest = _cheapest(pinned, spot=True)  # CatalogError: no spot offer there
        region = pinned.regions[0] if len(pinned.regions) == 1 else None
        places.append(
            PlaceConfig(
                name=name,
                cloud=cheapest.cloud,
                region=region,
                spot_price=cheapest.hourly_price if price is None else price,
                launch_cost=launch_cost(cheapest.cloud, region),
            )
        )
    return tuple(places)


def launch_costs(spec: JobSpec) -> Callable[[str, str | None], float]:
    """USD a launch in (cloud, region) pays to read the newest checkpoint from a bucket
    elsewhere: the egress price per GB (`storage.egress_usd_per_gb`) × its size. 0 beside the
    bucket, with no checkpoint yet, or when the bucket's region cannot be learned now (then
    only a bucket on another cloud is priced). The bucket is looked up once, and the
    checkpoint measured once, for every place."""
    from mncloud.errors import StorageError
    from mncloud.launch import newest_checkpoint_gb
    from mncloud.storage import BucketState, egress_usd_per_gb
    from mncloud.storage.prepare import SCHEME_CLOUD, inspect_bucket

    if spec.bucket is None:
        return lambda _cloud, _region: 0.0
    try:
        bucket = inspect_bucket(spec.bucket)
    except StorageError:  # unreachable now: the cloud it is on is still known from its scheme
        bucket = BucketState(
            str(spec.bucket), exists=True, cloud=SCHEME_CLOUD.get(spec.bucket.scheme)
        )
    sizes: list[float | None] = []  # measured at the first place that pays egress

    def cost(cloud: str, region: str | None) -> float:
        rate = egress_usd_per_gb(bucket, cloud, region)
        if rate <= 0:
            return 0.0
        if not sizes:
            sizes.append(newest_checkpoint_gb(spec.ckpt_uri))
        return rate * sizes[0] if sizes[0] else 0.0

    return cost


def home_on_demand_price(spec: JobSpec, home: PlaceConfig) -> float:
    """USD per node-hour of the cheapest on-demand offer in the home place."""
    pin: dict[str, list[str]] = {"clouds": [home.cloud] if home.cloud else spec.clouds}
    if home.region:
        pin["regions"] = [home.region]
    return _cheapest(spec.updated(**pin), spot=False).hourly_price


def _cheapest(spec: JobSpec, *, spot: bool) -> Offer:
    """The cheapest offer of the spec's hardware where it is allowed, in one market; the
    catalog's CatalogError (what it does offer) when there is none."""
    from mncloud import catalog

    search = catalog.offers(
        spec.accelerator.name,
        spec.accelerator.count,
        clouds=spec.clouds,
        regions=spec.regions,
        use_spot=spot,
        nodes=spec.nodes,
    )
    return min(search.offers, key=lambda o: (o.hourly_price, o.region_rank, o.cloud, o.region))
