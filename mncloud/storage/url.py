"""Bucket URLs: THE one parser of `s3://name[/prefix]`, `gs://name[/prefix]` and `file:///dir`.

The spec (`--bucket`), `open_bucket` and `mncloud ckpt` all parse through `BucketURL.parse`,
so a URL means the same everywhere. The rules:

- the scheme is `s3`, `gs` or `file` (any case); a bare path is not a URL (the CLI turns a
  directory into `file://` explicitly, see `BucketURL.directory`);
- `s3`/`gs`: a bucket name, then an optional prefix without empty, `.` or `..` parts; the name
  follows the cloud's own rules, checked by SkyPilot's validators (`check_name=True`);
- `file`: an absolute directory (`~` expands), resolved; it has no prefix.

SkyPilot's name rules are restated in `mncloud.storage.names` (SkyPilot takes seconds to
import; a test compares the two), and `open_bucket` (which every training rank calls) skips the
check: the names it sees were checked when the run was specified.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mncloud.errors import SpecError, StorageError

SCHEMES = ("s3", "gs", "file")
_USAGE = "use s3://bucket[/prefix], gs://bucket[/prefix] or file:///absolute/dir"


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
        """Validate a URL. `check_name`: also apply the cloud's bucket-name rules (SkyPilot's
        own rules). BucketURLError names what is wrong."""
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

    reason = name_error(scheme, name)
    if reason is not None:
        raise BucketURLError(f"bucket URL {text!r}: {reason}")


def join_key(*parts: str) -> str:
    """Join key parts with single `/`, dropping empty parts."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
