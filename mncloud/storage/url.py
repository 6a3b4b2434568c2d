"""Bucket URLs: THE one parser of `s3://name[/prefix]`, `gs://name[/prefix]` and `file:///dir`.

The spec (`--bucket`), `open_bucket` and `mncloud ckpt` all parse through `BucketURL.parse`,
so a URL means the same everywhere. The rules:

- the scheme is `s3`, `gs` or `file` (any case); a bare path is not a URL (the CLI turns a
  directory into `file://` explicitly, see `BucketURL.directory`);
- `s3`/`gs`: a bucket name, then an optional prefix without empty, `.` or `..` parts. With
  `check_name=True` (a new run's `--bucket`) the name follows the cloud's rules for new
  buckets, SkyPilot's (S3: 3–63 characters, lower-case letters, digits, dots, hyphens; GCS:
  3–63, or up to 222 with dots, underscores too). With `check_name=False` (`ckpt`, which reads
  any existing bucket, and `open_bucket`) it need only be one the cloud may still serve
  (`served_name_error`): S3's legacy us-east-1 names (up to 255 letters of either case, digits,
  dots, hyphens, underscores: botocore's own check) or GCS's (up to 222 characters, starting
  and ending with a letter or digit). A name beyond those is refused here, in one line, never
  sent to an SDK that would refuse it locally;
- `file`: an absolute directory (`~` expands), resolved; it has no prefix.

SkyPilot's name rules are restated in `mncloud.storage.names` (SkyPilot takes seconds to
import; a test compares the two), and `open_bucket` (which every training rank calls) skips
the new-bucket check: the names it sees were checked when the run was specified (it still
refuses, at no cost, a name no bucket can have).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mncloud.errors import SpecError, StorageError

SCHEMES = ("s3", "gs", "file")
_USAGE = "use s3://bucket[/prefix], gs://bucket[/prefix] or file:///absolute/dir"
#: The longest names a cloud serves: S3's legacy us-east-1 names, GCS's names with dots.
MAX_SERVED_LENGTH = {"s3": 255, "gs": 222}
_SERVED = {
    "s3": re.compile(r"[A-Za-z0-9._-]+"),  # botocore's VALID_BUCKET, but for the length
    "gs": re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"),  # google-cloud-storage's
}
_RULES = {
    "s3": "S3 bucket names are 3-63 lower-case letters, digits, dots and hyphens (legacy "
    "us-east-1 names: up to 255, upper case and underscores too)",
    "gs": "GCS bucket names are 3-63 lower-case letters, digits, dots, hyphens and "
    "underscores (up to 222 with dots), starting and ending with a letter or digit",
}


class BucketURLError(SpecError, StorageError):
    """A bucket URL is malformed: a bad request (SpecError) and a storage error alike."""


class BucketURL(BaseModel):
    """Where checkpoints and run records live: `s3://name[/prefix]`, `gs://…` or `file:///dir`."""

    model_config = ConfigDict(frozen=True)

    scheme: str
    """`s3`, `gs` or `file`."""
    name: str
    """Bucket name; for `file` the absolute directory."""
    prefix: str = ""
    """Key prefix inside the bucket, without leading or trailing slashes."""

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.name}"
        return f"{self.scheme}://{self.name}" + (f"/{self.prefix}" if self.prefix else "")

    @property
    def root(self) -> str:
        """The bucket's URL without the prefix: `s3://team-ckpt`, `file:///data/ckpt`."""
        return f"{self.scheme}://{self.name}"

    def child(self, *parts: str) -> str:
        """The URL of a folder below this one."""
        return "/".join([str(self).rstrip("/"), *(p.strip("/") for p in parts)])

    @classmethod
    def parse(cls, text: str, *, check_name: bool = True) -> BucketURL:
        """Validate a URL. `check_name`: the cloud's rules for a new bucket's name (SkyPilot's
        own rules); without it, only that the cloud may still serve the name (legacy S3 names
        too, see the module docstring). BucketURLError names what is wrong."""
        scheme, sep, rest = text.strip().partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in SCHEMES:
            raise BucketURLError(f"bucket URL {text!r}: {_USAGE}")
        if scheme == "file":
            path = Path(rest).expanduser()
            if not rest or not path.is_absolute():
                raise BucketURLError(
                    f"bucket URL {text!r}: a file:// URL needs an absolute path, "
                    "e.g. file:///data/ckpt"
                )
            return cls.directory(path)
        name, _, prefix = rest.partition("/")
        if not name:
            raise BucketURLError(f"bucket URL {text!r}: no bucket name; use {scheme}://NAME")
        if check_name:
            check_bucket_name(scheme, name, text)
        else:
            reason = served_name_error(scheme, name)
            if reason is not None:
                raise BucketURLError(f"bucket URL {_shown(text)}: {reason}")
        prefix = prefix.strip("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise BucketURLError(f"bucket URL {text!r}: the prefix has an empty, '.' or '..' part")
        return cls(scheme=scheme, name=name, prefix=prefix)

    @classmethod
    def directory(cls, path: str | Path) -> BucketURL:
        """A local directory as a `file://` bucket (made absolute)."""
        return cls(scheme="file", name=str(Path(path).expanduser().resolve()))


def check_bucket_name(scheme: str, name: str, text: str) -> None:
    """The cloud's bucket-name rules, as SkyPilot's validators state them (restated in
    `mncloud.storage.names`, so no SkyPilot import; a test compares the two)."""
    from mncloud.storage.names import name_error

    if len(name) > MAX_SERVED_LENGTH[scheme]:  # said shortly, not the name twice in full
        reason = served_name_error(scheme, name)
    else:
        reason = name_error(scheme, name)
    if reason is not None:
        raise BucketURLError(f"bucket URL {_shown(text)}: {reason}")


def served_name_error(scheme: str, name: str) -> str | None:
    """Why no `s3`/`gs` bucket can have this name, old or new, or None when one may.

    S3: what botocore sends at all (up to 255 letters of either case, digits, dots, hyphens,
    underscores: the legacy us-east-1 names, still served); GCS: up to 222 characters, which
    start and end with a letter or digit (google-cloud-storage's own check). Short names are
    left to the server, which answers at once.
    """
    longest = MAX_SERVED_LENGTH[scheme]
    if len(name) > longest:
        return f"the bucket name is {len(name)} characters long; {_RULES[scheme]}"
    if not _SERVED[scheme].fullmatch(name):
        return f"the bucket name {_shown(name)} is not valid; {_RULES[scheme]}"
    return None


def _shown(text: str, most: int = 80) -> str:
    """`text` quoted, its middle cut when it is longer than `most` characters."""
    if len(text) <= most:
        return repr(text)
    return repr(f"{text[: most // 2]}…{text[-most // 4 :]}")


def join_key(*parts: str) -> str:
    """Join key parts with single `/`, dropping empty parts."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
