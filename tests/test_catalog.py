"""Offers read through SkyPilot's catalog code over the shared snapshot."""

from __future__ import annotations

import math

import pytest

from mncloud import catalog
from mncloud.errors import CatalogError

pytestmark = pytest.mark.catalog


def test_default_clouds_are_the_snapshots() -> None:
    assert catalog.default_clouds() == ["aws", "gcp", "lambda", "runpod"]


def test_offers_match_skypilots_own_prices() -> None:
    import sky

    found = catalog.offers("H100", 8, nodes=4)
    assert {o.cloud for o in found.offers} == {"aws", "gcp", "lambda"}
    assert all(o.accelerator == "H100" and o.accelerator_count == 8 for o in found.offers)
    assert {(o.cloud, o.spot) for o in found.offers} >= {("aws", True), ("lambda", False)}
    for offer in found.offers:  # the price SkyPilot's optimizer charges (host + GPUs on GCP)
        resources = sky.Resources(
            infra=f"{offer.cloud}/{offer.region}",
            instance_type=offer.instance_type,
            accelerators={offer.accelerator: offer.accelerator_count},
            use_spot=offer.spot,
        )
        assert offer.hourly_price == pytest.approx(resources.get_cost(3600)), offer
    p5 = {(o.region, o.spot): o.hourly_price for o in found.offers if o.cloud == "aws"}
    assert p5[("us-east-1", True)] == pytest.approx(10.2397)


def test_skypilots_feature_check_excludes_clouds_with_its_reason() -> None:
    found = catalog.offers("A100-80GB", 1, nodes=2)
    assert "runpod" not in {o.cloud for o in found.offers}
    reasons = {e.cloud: e.reason for e in found.excluded}
    assert "multi-node" in reasons["runpod"].lower()
    spot = catalog.offers("H100", 8, use_spot=True)
    assert "lambda" not in {o.cloud for o in spot.offers}
    assert "spot" in {e.cloud: e.reason for e in spot.excluded}["lambda"].lower()
    single = catalog.offers("A100-80GB", 1, nodes=1)
    assert "runpod" in {o.cloud for o in single.offers}


def test_missing_spot_price_means_no_spot_offer() -> None:
    found = catalog.offers("H100", 8, clouds=["lambda"], use_spot=False)
    assert found.offers and not any(o.spot for o in found.offers)
    assert all(not math.isnan(o.hourly_price) for o in found.offers)


def test_region_filter_and_skypilots_region_order() -> None:
    found = catalog.offers("H100", 8, clouds=["lambda"], regions=["US-EAST-2", "asia-south-1"])
    assert {o.region for o in found.offers} == {"us-east-2", "asia-south-1"}
    by_region = {o.region: o.region_rank for o in found.offers}
    assert by_region["us-east-2"] < by_region["asia-south-1"]  # SkyPilot tries US regions first


def test_wrong_count_lists_what_is_available() -> None:
    with pytest.raises(CatalogError) as err:
        catalog.offers("H100", 3)
    message = str(err.value)
    assert "no offer for H100:3" in message
    assert "H100:8 on aws, gcp, lambda" in message


def test_cloud_without_the_gpu_lists_the_clouds_that_have_it() -> None:
    with pytest.raises(CatalogError, match=r"no offer for H100:8 on runpod.*H100:8 on aws"):
        catalog.offers("H100", 8, clouds=["runpod"])


def test_only_unsupported_clouds_give_skypilots_reason() -> None:
    with pytest.raises(CatalogError, match=r"no cloud can serve A100-80GB:1 on runpod.*Multi-node"):
        catalog.offers("A100-80GB", 1, clouds=["runpod"], nodes=2)


def test_unreadable_cloud_catalog_is_excluded_not_fatal() -> None:
    found = catalog.offers("H100", 8, clouds=["aws", "nosuchcloud"])
    assert {o.cloud for o in found.offers} == {"aws"}
    assert [e.cloud for e in found.excluded] == ["nosuchcloud"]
