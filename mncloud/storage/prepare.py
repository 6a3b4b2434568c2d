"""Bucket preparation before a launch: does the bucket exist, where is it, create it if missing.

`mncloud up` calls `prepare_bucket` once the plan is confirmed and before anything is
provisioned, so a training run never starts writing checkpoints into a bucket that is not
there or that the user's credentials cannot reach.

- S3 through boto3 (`AWS_ENDPOINT_URL` points it at an S3-compatible server), GCS through
  google-cloud-storage (`STORAGE_EMULATOR_HOST` points it at an emulator, with anonymous
  credentials as emulators expect). `file://` buckets are local folders: created, no region.
- A missing bucket is created in the cluster's region when bucket and cluster are on the same
  cloud; otherwise in the client's default location (S3: the session's region or us-east-1;
  GCS: the `US` multi-region). `prepare_bucket` announces the creation through a callback
  *before* creating, so the CLI can say so (core modules never print).
- A bucket on another cloud or in another region than the cluster costs egress on every
  checkpoint; `egress_warning` says so in one line.

Calls fail fast (a few seconds, no long retries): this runs while the user waits at the
prompt. Errors are `StorageError`s naming the bucket and what to do; credentials are never
part of a message.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mncloud.errors import StorageError
from mncloud.storage import gcs, s3
from mncloud.storage.url import BucketURL

#: The cloud that hosts each bucket scheme (SkyPilot's registry names).
SCHEME_CLOUD = {"s3": "aws", "gs": "gcp"}
#: GCS multi-region locations and the region-name prefixes they contain.
_GCS_MULTI_REGIONS = {"us": ("us-",), "eu": ("europe-",), "asia": ("asia-",)}


@dataclass(frozen=True)
class BucketState:
    """What we know about one bucket."""

    url: str
    """The bucket's URL without prefix: `s3://team-ckpt`."""
    exists: bool
    cloud: str | None = None
    """`aws`, `gcp`, or None for a local folder."""
    region: str | None = None
    """Lower case: `us-east-1`, `us-central1`, `us` (a GCS multi-region); None if unknown."""
    created: bool = False
    """True when `prepare_bucket` created it just now."""


def _bucket_url(url: BucketURL | str) -> BucketURL:
    return BucketURL.parse(url, check_name=False) if isinstance(url, str) else url


def inspect_bucket(url: BucketURL | str) -> BucketState:
    """Whether the bucket exists and, if so, its region. Raises StorageError if unreachable."""
    url = _bucket_url(url)
    if url.scheme == "file":
        return BucketState(url.root, exists=Path(url.name).is_dir())
    if url.scheme == "s3":
        return _s3_inspect(url)
    return _gcs_inspect(url)


def create_bucket(url: BucketURL | str, region: str | None) -> BucketState:
    """Create the bucket in `region` (None: the client's default); return its state."""
    url = _bucket_url(url)
    if url.scheme == "file":
        Path(url.name).mkdir(parents=True, exist_ok=True)
        return BucketState(url.root, exists=True, created=True)
    if url.scheme == "s3":
        return _s3_create(url, region or s3.default_region())
    return _gcs_create(url, region)


def creation_region(url: BucketURL | str, cloud: str | None, region: str | None) -> str | None:
    """Where to create a missing bucket for a cluster in `cloud`/`region`."""
    url = _bucket_url(url)
    if url.scheme == "file":
        return None
    if cloud is not None and SCHEME_CLOUD[url.scheme] == cloud.lower() and region:
        return region.lower()
    return s3.default_region() if url.scheme == "s3" else "us"


#: USD per GB between two regions of one cloud. SkyPilot prices only internet egress
#: (`Cloud.get_egress_cost`: what leaves a cloud); AWS and GCP list inter-region transfer at
#: $0.01–0.02/GB within a continent (more across continents): this is the upper of those.
INTER_REGION_USD_PER_GB = 0.02


def egress_usd_per_gb(state: BucketState, cloud: str | None, region: str | None) -> float:
    """USD per GB a cluster in `cloud`/`region` pays to read the bucket: 0 beside it (or
    unknown); across clouds, SkyPilot's internet-egress price of the bucket's cloud."""
    if state.cloud is None or cloud is None:
        return 0.0
    if state.cloud != cloud.lower():
        from sky.utils import registry

        from mncloud.catalog.index import quiet_sky

        with quiet_sky():
            registered = registry.CLOUD_REGISTRY.from_str(state.cloud)
            # per GB over 100 GB: SkyPilot's tiers give the first GB free
            return float(registered.get_egress_cost(100.0)) / 100 if registered else 0.0
    if region is None or state.region is None or _same_location(state.region, region.lower()):
        return 0.0
    return INTER_REGION_USD_PER_GB


def egress_warning(
    state: BucketState, cloud: str | None, region: str | None, gigabytes: float | None = None
) -> str | None:
    """One line when the bucket is on another cloud or in another region than the cluster,
    naming the price per GB and, given the checkpoint's size, what a launch there costs."""
    if state.cloud is None or cloud is None:
        return None
    cloud = cloud.lower()
    where = f"{cloud} {region}" if region else cloud
    rate = egress_usd_per_gb(state, cloud, region)
    cost = f" (${rate:.2f}/GB" + (
        f": ${rate * gigabytes:,.2f} per launch for the newest checkpoint, {gigabytes:,.1f} GB)"
        if gigabytes
        else ")"
    )
    if state.cloud != cloud:
        return (
            f"bucket {state.url} is on {state.cloud} ({state.region or 'unknown region'}) but "
            f"the cluster runs on {where}: every checkpoint crosses clouds and is billed as "
            f"egress{cost}; use a bucket on the cluster's cloud to avoid it"
        )
    if rate == 0.0:
        return None
    return (
        f"bucket {state.url} is in {state.region} but the cluster runs in {region}: "
        f"cross-region transfer is billed per GB{cost}; use a bucket in the cluster's region"
    )


def _same_location(bucket_region: str, region: str) -> bool:
    if bucket_region == region:
        return True
    prefixes = _GCS_MULTI_REGIONS.get(bucket_region, ())
    return any(region.startswith(p) for p in prefixes)


def prepare_bucket(
    url: BucketURL | str,
    cloud: str | None,
    region: str | None,
    announce: Callable[[str], None] = lambda _message: None,
) -> tuple[BucketState, str | None]:
    """Make sure the bucket exists (creating it after `announce`-ing so); return its state and
    an egress warning (or None) for a cluster in `cloud`/`region`."""
    url = _bucket_url(url)
    state = inspect_bucket(url)
    if not state.exists:
        where = creation_region(url, cloud, region)
        place = f" in {SCHEME_CLOUD.get(url.scheme, 'local')} {where}" if where else ""
        announce(f"Bucket {state.url} does not exist: creating it{place}.")
        state = replace(create_bucket(url, where), created=True)
    return state, egress_warning(state, cloud, region)


# --------------------------------------------------------------------------------------- S3


def _s3_client() -> Any:
    return s3.make_client(read_timeout=20)


def _s3_error(url: BucketURL, err: Exception, action: str) -> StorageError:
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        return StorageError(
            f"cannot {action} {url.root}: {s3.NO_CREDENTIALS} (then `sky check aws`)"
        )
    if isinstance(err, ClientError):
        code = s3.error_code(err)
        if code in s3.DENIED_CODES:
            return StorageError(
                f"cannot {action} {url.root}: access denied ({code}); the bucket may belong to "
                "another account, or your credentials lack s3 permissions"
            )
        if code == "BucketAlreadyExists":
            return StorageError(
                f"cannot create {url.root}: the name is taken by another account; choose another "
                "--bucket name"
            )
        message = err.response.get("Error", {}).get("Message", "")
        return StorageError(f"cannot {action} {url.root}: {code} {message}".strip())
    where = os.environ.get("AWS_ENDPOINT_URL") or "S3"
    return StorageError(
        f"cannot {action} {url.root}: {where} unreachable ({type(err).__name__}); check the network"
    )


def _s3_inspect(url: BucketURL) -> BucketState:
    from botocore.exceptions import BotoCoreError, ClientError

    client = _s3_client()
    try:
        client.head_bucket(Bucket=url.name)
    except ClientError as err:
        code = s3.error_code(err)
        if code in ("404", "NoSuchBucket", "NotFound"):
            return BucketState(url.root, exists=False, cloud="aws")
        raise _s3_error(url, err, "reach") from None
    except BotoCoreError as err:
        raise _s3_error(url, err, "reach") from None
    try:
        location = client.get_bucket_location(Bucket=url.name).get("LocationConstraint")
    except (ClientError, BotoCoreError):  # may be denied while the bucket is usable
        location = None
        region = None
    else:
        # S3's legacy answers: no constraint means us-east-1, "EU" means eu-west-1.
        region = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, location)
    return BucketState(url.root, exists=True, cloud="aws", region=region and region.lower())


def _s3_create(url: BucketURL, region: str) -> BucketState:
    from botocore.exceptions import BotoCoreError, ClientError

    kwargs: dict[str, Any] = {"Bucket": url.name}
    if region != "us-east-1":  # S3 rejects an explicit us-east-1 constraint
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        _s3_client().create_bucket(**kwargs)
    except ClientError as err:
        code = s3.error_code(err)
        if code != "BucketAlreadyOwnedByYou":
            raise _s3_error(url, err, "create") from None
    except BotoCoreError as err:
        raise _s3_error(url, err, "create") from None
    return BucketState(url.root, exists=True, cloud="aws", region=region.lower(), created=True)


# -------------------------------------------------------------------------------------- GCS


def _gcs_error(url: BucketURL, err: Exception, action: str) -> StorageError:
    from google.api_core import exceptions as gexc

    if isinstance(err, (gexc.Forbidden, gexc.Unauthorized)):
        return StorageError(
            f"cannot {action} {url.root}: access denied; the bucket may belong to another project, "
            "or your credentials lack storage permissions"
        )
    if isinstance(err, gexc.Conflict):
        return StorageError(
            f"cannot create {url.root}: the name is taken; choose another --bucket name"
        )
    if isinstance(err, gexc.GoogleAPICallError):
        return StorageError(f"cannot {action} {url.root}: {err.code} {err.message}")
    return StorageError(
        f"cannot {action} {url.root}: GCS unreachable ({type(err).__name__}); check the network"
    )


def _gcs_inspect(url: BucketURL) -> BucketState:
    client = gcs.make_client()
    try:
        bucket = client.lookup_bucket(url.name, timeout=20, retry=gcs.short_retry())
    except Exception as err:  # google.api_core and requests exception types
        raise _gcs_error(url, err, "reach") from None
    if bucket is None:
        return BucketState(url.root, exists=False, cloud="gcp")
    location = (bucket.location or "").lower() or None
    return BucketState(url.root, exists=True, cloud="gcp", region=location)


def _gcs_create(url: BucketURL, region: str | None) -> BucketState:
    client = gcs.make_client()
    try:
        bucket = client.create_bucket(url.name, location=region, timeout=20)
    except Exception as err:  # google.api_core and requests exception types
        raise _gcs_error(url, err, "create") from None
    location = (bucket.location or region or "").lower() or None
    return BucketState(url.root, exists=True, cloud="gcp", region=location, created=True)
