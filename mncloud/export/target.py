"""Where an export goes: a directory (written beside it, renamed into place) or a bucket prefix
(staged locally, uploaded, `export.json` last). Either way a failed export leaves nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from mncloud.errors import MncloudError
from mncloud.export.model import EXPORT_MANIFEST, ExportError
from mncloud.storage.buckets import Bucket
from mncloud.storage.factory import open_bucket
from mncloud.storage.url import BucketURL, join_key


class Target:
    """An output location, checked at `open`; `staging` is the local folder to write into."""

    def __init__(self, shown: str, staging: Path) -> None:
        self.shown = shown
        """The output as the user named it (resolved), for messages and the result."""
        self.staging = staging

    @staticmethod
    def open(out: str, *, overwrite: bool) -> Target:
        """The output `out` names (a directory, or s3:// gs:// file://); ExportError when it
        exists and is not empty, unless `overwrite`."""
        if not out.strip():
            raise ExportError("--out is empty; give a directory or an s3:// or gs:// URL")
        if "://" in out:
            url = BucketURL.parse(out, check_name=False)
            if url.scheme != "file":
                return BucketTarget.open_url(url, overwrite=overwrite)
            out = url.name
        return DirTarget.open_dir(out, overwrite=overwrite)

    def commit(self, names: list[str], manifest: bytes) -> None:
        """Put the staged files `names` and then `export.json` in place."""
        raise NotImplementedError

    def abort(self) -> None:
        """Remove everything this export made."""
        shutil.rmtree(self.staging, ignore_errors=True)


class DirTarget(Target):
    """A local directory: files go to a hidden sibling that is renamed onto it at the end."""

    def __init__(self, dest: Path, staging: Path, made: list[Path]) -> None:
        super().__init__(str(dest), staging)
        self.dest = dest
        self.made = made
        """Parent folders this export created (removed again if it fails)."""

    @classmethod
    def open_dir(cls, out: str, *, overwrite: bool) -> DirTarget:
        try:
            dest = Path(out).expanduser().resolve()
        except (OSError, RuntimeError, ValueError) as err:
            raise ExportError(f"--out {out!r}: {err}") from None
        if dest.exists() and not dest.is_dir():
            raise ExportError(f"--out {out!r} is a file, not a directory")
        if dest.is_dir() and any(dest.iterdir()) and not overwrite:
            raise ExportError(
                f"--out {out!r} exists and is not empty; add --overwrite to replace it"
            )
        made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.export-", dir=dest.parent))
        except OSError as err:
            _remove_empty(made)
            raise ExportError(f"--out {out!r}: cannot write there: {err.strerror}") from None
        return cls(dest, staging, made)

    def commit(self, names: list[str], manifest: bytes) -> None:
        (self.staging / EXPORT_MANIFEST).write_bytes(manifest)
        umask = os.umask(0)
        os.umask(umask)
        self.staging.chmod(0o777 & ~umask)  # as a plain mkdir would make it, not mkdtemp's 0700
        for name in [*names, EXPORT_MANIFEST]:
            (self.staging / name).chmod(0o666 & ~umask)
        old = None
        if self.dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.dest.name}.old-", dir=self.dest.parent))
            os.replace(self.dest, old / "export")
        os.replace(self.staging, self.dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        super().abort()
        _remove_empty(self.made)


class BucketTarget(Target):
    """A bucket prefix: staged in a local temporary folder, then uploaded file by file (each
    object appears whole or not at all), `export.json` last; an earlier export there (with
    `--overwrite`) is removed first, its `export.json` before the rest."""

    def __init__(self, url: BucketURL, bucket: Bucket, prefix: str, staging: Path) -> None:
        super().__init__(str(url), staging)
        self.bucket, self.prefix = bucket, prefix
        self.uploaded: list[str] = []

    @classmethod
    def open_url(cls, url: BucketURL, *, overwrite: bool) -> BucketTarget:
        bucket, prefix = open_bucket(url)
        if not prefix:
            raise ExportError(f"--out {url}: give a folder in the bucket, e.g. {url}/export")
        if bucket.list(prefix + "/") and not overwrite:
            raise ExportError(f"--out {url} exists and is not empty; add --overwrite to replace it")
        return cls(url, bucket, prefix, Path(tempfile.mkdtemp(prefix="mncloud-export-")))

    def commit(self, names: list[str], manifest: bytes) -> None:
        old = self.bucket.list(self.prefix + "/")
        manifest_key = join_key(self.prefix, EXPORT_MANIFEST)
        for obj in sorted(old, key=lambda o: o.key != manifest_key):  # export.json first
            self.bucket.delete(obj.key)
        for name in names:
            key = join_key(self.prefix, name)
            self.bucket.put_file(key, self.staging / name)
            self.uploaded.append(key)
        self.bucket.put_bytes(manifest_key, manifest)
        self.uploaded.append(manifest_key)
        shutil.rmtree(self.staging, ignore_errors=True)

    def abort(self) -> None:
        super().abort()
        for key in reversed(self.uploaded):
            with contextlib.suppress(MncloudError):
                self.bucket.delete(key)


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders an export created (deepest first), if still empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
