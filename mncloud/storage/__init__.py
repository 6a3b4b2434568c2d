"""Object storage for checkpoints and run records: one `Bucket` interface over S3, GCS and a
local directory, bucket preparation before a launch, and the checkpoint layout.

    url.py          BucketURL: THE parser of s3://, gs:// and file:// URLs
    buckets.py      the Bucket protocol, LocalBucket, atomic writes
    factory.py      open_bucket: a URL → the bucket of its scheme
    s3.py, gcs.py   the S3 and GCS buckets (their SDKs imported on first use)
    retry.py        retrying transient failures (tenacity) within a time budget
    prepare.py      before `up`: does the bucket exist, where, create it, egress warning
    checkpoints.py  step folders, manifest, COMPLETE, verification, retention, pull
    chunks.py       per-chunk hashes of a step's shard files (sidecars): a range checked alone
    rangeread.py    verified ranged reads of a step's files: what a resume fetches
    folders.py      `--ckpt-dir`'s checkpoint folders committed whole: markers, verdicts, hints
    foldersync.py   one node's `--ckpt-dir` synced, folders committed (a process on cloud VMs)
    folderrestore.py  what a node's `--ckpt-dir` restore brings (the newest), the disk checked
    transfer.py     a unit's files moved at the storage's speed: parallel ranges, hashed in passing
    names.py        SkyPilot's bucket-name rules, restated so a check imports nothing
    lighthouse.py   where a cloud run's nodes find torchft's lighthouse
    stoprequest.py  a stop request in the bucket: `down`'s notice to a cloud run
    final.py        a finished run's final figures (final.json beside its checkpoints; a
                    `--ckpt-dir` run's from its newest committed unit's weights)
    shapes.py       does a checkpoint fit the model a script builds (names and shapes)
    frameworkdirs.py  a framework's checkpoints in a `--ckpt-dir` folder by name: the newest

Importing the package is light: no SDK, no SkyPilot, no torch.
"""

from __future__ import annotations

from mncloud.storage.buckets import (
    Bucket,
    LocalBucket,
    ObjectInfo,
    ObjectNotFoundError,
    ShortReadError,
    atomic_path,
    delete_prefix,
    set_simulated_outage,
    write_atomic,
)
from mncloud.storage.checkpoints import CheckpointStore, Manifest
from mncloud.storage.factory import open_bucket
from mncloud.storage.prepare import BucketState, egress_usd_per_gb, egress_warning, prepare_bucket
from mncloud.storage.url import BucketURL, BucketURLError, join_key

__all__ = [
    "Bucket",
    "BucketState",
    "BucketURL",
    "BucketURLError",
    "CheckpointStore",
    "LocalBucket",
    "Manifest",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ShortReadError",
    "atomic_path",
    "delete_prefix",
    "egress_usd_per_gb",
    "egress_warning",
    "join_key",
    "open_bucket",
    "prepare_bucket",
    "set_simulated_outage",
    "write_atomic",
]
