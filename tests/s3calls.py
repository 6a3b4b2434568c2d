"""Pytest plugin: the S3 operations mncloud's own boto3 clients make, recorded.

With `MNCLOUD_S3_CALLS=FILE` set, every client `mncloud.storage.s3` makes gets a handler on
botocore's `before-call.s3` event, which botocore fires with the operation's model before each
request; the operations' names go to FILE (one a line, sorted) when the session ends. The
clients are otherwise unchanged, and clients the tests make themselves (to set up a bucket)
are not recorded. `tests/test_cloud_setup.py` runs the suite's S3 tests with it
(`-p tests.s3calls`) and holds the AWS page's IAM policy to what it recorded.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

ENV = "MNCLOUD_S3_CALLS"
_seen: set[str] = set()
_lock = threading.Lock()


def _record(model: Any, **_: Any) -> None:
    with _lock:
        _seen.add(str(model.name))


def pytest_configure(config: pytest.Config) -> None:
    """Wrap the one function that makes mncloud's S3 clients (every client comes from it)."""
    if not os.environ.get(ENV):
        return
    from mncloud.storage import s3

    made = s3._new_client

    def recording(*args: Any, **kwargs: Any) -> Any:
        client = made(*args, **kwargs)
        client.meta.events.register("before-call.s3", _record)
        return client

    s3._new_client = recording


def pytest_unconfigure(config: pytest.Config) -> None:
    if path := os.environ.get(ENV):
        Path(path).write_text("".join(f"{name}\n" for name in sorted(_seen)))
