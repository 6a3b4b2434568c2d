"""Every path and URI mncloud builds: its home, a run's folder, run records, checkpoints.

One owner for each location, so two modules can never disagree on where a thing lives:

    $MNCLOUD_HOME (default ~/.mncloud)
      runs/<name>/              one folder per run name (a relaunch of the name replaces it)
      runs/<name>/checkpoints/  a local run's checkpoints without --bucket (kept on relaunch)
      runs/<name>/control/      the deadline controller's state and log (kept on relaunch)
      records/<run-id>/         run records, kept apart from runs/ on purpose
      records/.locks/           lock files of the record store
      reruns/<name>/            git worktrees `mncloud rerun` builds
      sky-runtime/<digest>/     SkyPilot's runtime dir for an offline catalog snapshot
      sky-cache/                what plan and render read from SkyPilot, cached (skycache.py)
    <bucket>/<name>                       MNCLOUD_CKPT_URI: the run's checkpoints
    <bucket>/<name>/runs/<run-id>         the bucket copy of a run record
    <bucket>/<name>/runs/<run-id>/series  the ranks' telemetry segments (steps, metrics, events)
    <bucket>/<name>/ckpt-dir              what a script saves in its `--ckpt-dir` folder
    <bucket>/<name>/control/state.json    the deadline controller's state (cloud runs)
    <bucket>/<name>/export                `up --export-on-finish`: the exported model

Pure path arithmetic: no I/O, no imports beyond the standard library.
"""

from __future__ import annotations

import os
from pathlib import Path

from mncloud.constants import HOME_ENV

RUNS_DIR = "runs"
RECORDS_DIR = "records"
LOCKS_DIR = ".locks"
RERUNS_DIR = "reruns"
SKY_RUNTIME_DIR = "sky-runtime"
SKY_CACHE_DIR = "sky-cache"
PROFILES_DIR = "profiles"
#: Under a run's record prefix: the ranks' telemetry segments (`telemetry.series`).
SERIES_DIR = "series"
LOCAL_CKPT_DIR = "checkpoints"
CKPT_DIR_NAME = "ckpt-dir"
CONTROL_DIR = "control"
CONTROL_STATE = "state.json"
CONTROL_LOG = "controller.log"
EXPORT_DIR = "export"
#: The folder put first on a worker's PYTHONPATH (local nodes, `mncloud profile`), holding
#: `sitecustomize.py`, a copy of `site_hook_source()` (`mncloud.train.sitehook`).
SITE_HOOK_DIR = "site-hook"
SITE_HOOK_FILE = "sitecustomize.py"


def home() -> Path:
    """mncloud's own state folder: `$MNCLOUD_HOME` or `~/.mncloud`."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".mncloud").expanduser()


def runs_root() -> Path:
    """The folder holding one sub-folder per run name."""
    return home() / RUNS_DIR


def run_dir(run_name: str) -> Path:
    """The folder of one run: backend choice, state, logs, events."""
    return runs_root() / run_name


def local_ckpt_dir(run_name: str) -> Path:
    """Where a local run without `--bucket` keeps its checkpoints."""
    return run_dir(run_name) / LOCAL_CKPT_DIR


def replaced_ckpt_dir(run_name: str, stamp: str) -> Path:
    """Where `up --replace` sets a local run's earlier checkpoints aside (never deleted)."""
    return run_dir(run_name) / f"{LOCAL_CKPT_DIR}.replaced-{stamp}"


def control_dir(run_name: str) -> Path:
    """The deadline controller's folder in a run folder (a relaunch of the name keeps it)."""
    return run_dir(run_name) / CONTROL_DIR


def control_state_file(run_name: str) -> Path:
    """The deadline controller's state: mode, progress, slack, cost (`mncloud status`)."""
    return control_dir(run_name) / CONTROL_STATE


def control_log(run_name: str) -> Path:
    """What a detached deadline controller prints."""
    return control_dir(run_name) / CONTROL_LOG


def records_root() -> Path:
    """The folder holding one sub-folder per run record."""
    return home() / RECORDS_DIR


def record_dir(run_id: str) -> Path:
    """The local copy of one run record."""
    return records_root() / run_id


def records_index() -> Path:
    """The summary of every record here (`records.index`): one file, beside the records."""
    return records_root() / ".index.json"


def record_locks_dir() -> Path:
    """Lock files that serialise writers of the record store."""
    return records_root() / LOCKS_DIR


def rerun_dir(run_name: str) -> Path:
    """The git worktree `mncloud rerun` rebuilds a run in."""
    return home() / RERUNS_DIR / run_name


def sky_runtime_dir(digest: str) -> Path:
    """SkyPilot's runtime folder for one offline catalog snapshot."""
    return home() / SKY_RUNTIME_DIR / digest


def profiles_dir() -> Path:
    """Where `mncloud profile` keeps each script's profile (one JSON file per script version)."""
    return home() / PROFILES_DIR


def sky_cache_dir() -> Path:
    """Answers read from SkyPilot once (offers index, task schema), kept between commands."""
    return home() / SKY_CACHE_DIR


def ckpt_uri(bucket: object, run_name: str) -> str:
    """`<bucket>/<name>`: the run's checkpoint prefix (MNCLOUD_CKPT_URI); runs sharing a
    bucket never collide. `bucket` is a BucketURL or its string."""
    return join_uri(str(bucket), run_name)


def record_uri(ckpt_uri: str, run_id: str) -> str:
    """`<ckpt uri>/runs/<run-id>`: the bucket copy of a run record."""
    return join_uri(ckpt_uri, RUNS_DIR, run_id)


def series_uri(ckpt_uri: str, run_id: str) -> str:
    """`<ckpt uri>/runs/<run-id>/series`: the ranks' telemetry segments (`telemetry.series`)."""
    return join_uri(record_uri(ckpt_uri, run_id), SERIES_DIR)


def control_state_uri(ckpt_uri: str) -> str:
    """`<ckpt uri>/control/state.json`: the deadline controller's state beside the checkpoints
    (a cloud run's controller runs away from this machine; `status` reads it there)."""
    return join_uri(ckpt_uri, CONTROL_DIR, CONTROL_STATE)


def ckpt_dir_uri(ckpt_uri: str) -> str:
    """`<ckpt uri>/ckpt-dir`: the bucket side of a run's `--ckpt-dir` folder."""
    return join_uri(ckpt_uri, CKPT_DIR_NAME)


def mounted_ckpt_dir(mount_path: str, bucket_prefix: str, run_name: str) -> str:
    """Where the `--ckpt-dir` folder appears on a node that mounts the whole bucket at
    `mount_path`: `<mount>/<prefix>/<name>/ckpt-dir`."""
    return join_uri(mount_path, bucket_prefix, run_name, CKPT_DIR_NAME)


def site_hook_source() -> Path:
    """The site hook's source in the installed package (`templates/sitecustomize.py.j2`)."""
    return Path(__file__).parent / "templates" / "sitecustomize.py.j2"


def site_hook_dir(folder: Path) -> Path:
    """`<folder>/site-hook`: where a run's or a profile's copy of the site hook lives."""
    return folder / SITE_HOOK_DIR


def join_uri(base: str, *parts: str) -> str:
    """Join a URI and path parts with single slashes (`file:///x` keeps its three)."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])
