"""The script's final result beside its checkpoints (`final.json`: steps, the sha256 of its
weights), written by `mncloud.train.Progress`, read by `status`, `runs` and the local
reference run, whichever backend ran it."""

from __future__ import annotations

import json
from typing import Any

from mncloud.storage.buckets import ObjectNotFoundError
from mncloud.storage.factory import open_bucket
from mncloud.storage.url import join_key

FINAL_FILE = "final.json"


def read_final(ckpt_uri: str) -> dict[str, Any] | None:
    """The script's final.json beside its checkpoints, or None."""
    bucket, prefix = open_bucket(ckpt_uri, retry_seconds=5)
    try:
        return dict(json.loads(bucket.get_bytes(join_key(prefix, FINAL_FILE))))
    except ObjectNotFoundError:
        return None
