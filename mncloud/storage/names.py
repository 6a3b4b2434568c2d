"""SkyPilot's bucket-name rules for S3 and GCS, restated so checking a name costs no import.

`S3Store.validate_name` and `GcsStore.validate_name` (sky/data/storage.py, SkyPilot 0.14) in
the same order with the same messages; tests/test_cache.py compares the two on many names.
"""

from __future__ import annotations

import re

_IP = r"^(?:\d{1,3}\.){3}\d{1,3}$"


def name_error(scheme: str, name: str) -> str | None:
    """SkyPilot's message for an invalid `s3`/`gs` bucket name (without its `Invalid store
    name: ` prefix), or None when SkyPilot accepts the name."""
    return _s3_error(name) if scheme == "s3" else _gcs_error(name)


def _s3_error(name: str) -> str | None:
    if not 3 <= len(name) <= 63:
        return f"name {name} must be between 3 (min) and 63 (max) characters long."
    if not re.match(r"^[a-z0-9][-a-z0-9.]*[a-z0-9]$", name):
        return (
            f"name {name} can consist only of lowercase letters, numbers, dots (.), and "
            "hyphens (-). It must begin and end with a letter or number."
        )
    if ".." in name:
        return f"name {name} must not contain two adjacent periods."
    if re.match(_IP, name):
        return f"name {name} must not be formatted as an IP address (for example, 192.168.5.4)."
    if name.startswith("xn--"):
        return f'name {name} must not start with the prefix "xn--".'
    if name.endswith("-s3alias"):
        return f'name {name} must not end with the suffix "-s3alias".'
    if name.endswith("--ol-s3"):
        return f'name {name} must not end with the suffix "--ol-s3".'
    return None


def _gcs_error(name: str) -> str | None:
    if not 3 <= len(name) <= 222:
        return f"name {name} must contain 3-222 characters."
    if not re.match(r"^[a-z0-9][-a-z0-9._]*[a-z0-9]$", name):
        return (
            f"name {name} can only contain lowercase letters, numeric characters, dashes (-), "
            "underscores (_), and dots (.). Spaces are not allowed. Names must start and end "
            "with a number or letter."
        )
    if name.startswith("goog") or any(s in name for s in ["google", "g00gle", "go0gle", "g0ogle"]):
        return (
            f'name {name} cannot begin with the "goog" prefix or contain "google" in various forms.'
        )
    if any(len(component) > 63 for component in name.split(".")):
        return f"Dot-separated components in name {name} can be no longer than 63 characters."
    if ".." in name or ".-" in name or "-." in name:
        return f"name {name} must not contain two adjacent periods or a dot next to a hyphen."
    if re.match(_IP, name):
        return (
            f"name {name} cannot be represented as an IP address in dotted-decimal notation "
            "(for example, 192.168.5.4)."
        )
    return None
