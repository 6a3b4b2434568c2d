"""The record store: one run record on this machine and in the bucket, and its events.

At `up` a record is created for the run and written twice: on this machine
(`layout.record_dir(run_id)/run.json`) and in the bucket beside the checkpoints
(`layout.record_uri(...)/run.json`), each with the uncommitted diff as `diff.patch` beside it.
The bucket copy outlives the laptop; the local copy outlives a lost bucket. A bucket failure
never breaks a run: it is logged and the local copy still holds everything. Local records live
outside the run folder on purpose: a backend replaces that folder when a name is launched
again, and the record of the earlier run must survive it. Run ids are
`<name>-<UTC time>-<6 hex>`, so a name's newest record is its current one.

Writers of one run's record (the CLI, a backend's supervisor thread, several processes) take
a file lock (`filelock`) under `layout.record_locks_dir()` around read-modify-write. Secrets
never reach a record: every string is scrubbed (`redact.py`) when it is written. Every write
also updates the record's entry in the index (`records.index`), through which a run's newest
record (`load_current`), a record by id or name (`find_record`) and the listings
(`list_summaries`) are found without parsing every record.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import getpass
import itertools
import json
import logging
import os
import platform
import re
import secrets as _secrets
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from mncloud import layout
from mncloud.errors import MncloudError, RunNotFoundError
from mncloud.records import index
from mncloud.records.lineage import capture_git, installed_packages
from mncloud.records.model import OPENS_SEGMENT, Event, EventKind, RecordError, RunRecord
from mncloud.redact import spec_redactor
from mncloud.storage import write_atomic

if TYPE_CHECKING:
    from mncloud.render import RenderedTask
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import LaunchOptions

log = logging.getLogger(__name__)

RECORD_FILE = "run.json"
DIFF_FILE = "diff.patch"
#: Record writes to the bucket give up after this long (the local copy is always written).
BUCKET_RETRY_SECONDS = 5.0
#: Placement fields a segment-opening event inherits from the previous opening event.
_PLACEMENT = ("cloud", "region", "instance_type", "spot", "hourly_price")


def _id_of_name(name: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(name)}-\d{{8}}T\d{{6}}-[0-9a-f]{{6}}$")


def new_run_id(name: str, now: float | None = None) -> str:
    """`<name>-<UTC yyyymmddThhmmss>-<6 hex>`: sortable, unique, readable."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{name}-{stamp}-{_secrets.token_hex(3)}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return os.environ.get("USER", "unknown")


def create_record(
    spec: JobSpec,
    task: RenderedTask | str,
    plan: Any = None,
    backend: str = "local",
    *,
    run_id: str | None = None,
    launch_options: LaunchOptions | Mapping[str, Any] | None = None,
    now: float | None = None,
    save: bool = True,
) -> RunRecord:
    """Build the run's record at `up` and (with `save`) write it locally and to the bucket.

    `task` is the RenderedTask (or its YAML text); `plan` a `mncloud.plan.Plan`, its JSON, or
    None; `launch_options` the LaunchOptions (or their JSON) `rerun` will launch with again.
    Pass `run_id` when the task was rendered with it (see `constants.RUN_ID_ENV`).
    """
    now = time.time() if now is None else now
    git, diff = capture_git(spec.workdir, spec_redactor(spec))
    plan_data: dict[str, Any] | None = None
    if plan is not None:
        plan_data = plan.to_json(top=10) if hasattr(plan, "to_json") else dict(plan)
    options: dict[str, Any] = {}
    if launch_options is not None:
        options = (
            dict(launch_options)
            if isinstance(launch_options, Mapping)
            else launch_options.model_dump(mode="json")
        )
    run_id = run_id or new_run_id(spec.name, now)
    record = RunRecord(
        run_id=run_id,
        name=spec.name,
        user=_user(),
        host=socket.gethostname(),
        created_at=now,
        python=platform.python_version(),
        backend=backend,
        nodes=spec.nodes,
        git=git,
        spec=spec.model_dump(mode="json"),
        launch_options=options,
        task_yaml=task if isinstance(task, str) else task.yaml_text,
        plan=plan_data,
        packages=installed_packages(),
        image=spec.image,
        labels=dict(spec.labels),
        bucket_uri=(
            layout.record_uri(layout.ckpt_uri(spec.bucket, spec.name), run_id)
            if spec.bucket
            else None
        ),
    )
    if save:
        save_record(record, diff=diff)
    return record


def _scrubbed(record: RunRecord) -> dict[str, Any]:
    return spec_redactor(record.spec).scrub_obj(record.model_dump(mode="json"))


def _serialize(record: RunRecord) -> bytes:
    return (json.dumps(_scrubbed(record), indent=2) + "\n").encode()


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock on run `name`'s record (several processes may append events)."""
    folder = layout.record_locks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / f"{name}.lock"):
        yield


def save_record(record: RunRecord, *, diff: bytes | None = None) -> None:
    """Write the record (and `diff`) locally, atomically, then to the bucket (best effort)."""
    folder = layout.record_dir(record.run_id)
    data = _scrubbed(record)
    payload = (json.dumps(data, indent=2) + "\n").encode()
    write_atomic(folder / RECORD_FILE, payload)
    index.note(record.run_id, folder / RECORD_FILE, data)
    if diff:
        write_atomic(folder / DIFF_FILE, diff)
    if record.bucket_uri:
        _push(record.bucket_uri, payload, diff)


def _push(uri: str, payload: bytes, diff: bytes | None) -> None:
    from mncloud.storage import join_key, open_bucket

    try:
        bucket, prefix = open_bucket(uri, retry_seconds=BUCKET_RETRY_SECONDS)
        bucket.put_bytes(join_key(prefix, RECORD_FILE), payload)
        if diff:
            bucket.put_bytes(join_key(prefix, DIFF_FILE), diff)
    except Exception as err:  # the record must never break a run
        log.warning("run record not written to %s: %s", uri, err)


def _load_file(path: Path) -> RunRecord:
    try:
        return RunRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as err:
        raise RecordError(f"run record {path} is unreadable ({type(err).__name__})") from None


def list_records(name: str | None = None) -> list[RunRecord]:
    """Every record on this machine (of run `name` only, if given), oldest first."""
    root = layout.records_root()
    if not root.is_dir():
        return []
    records = []
    for folder in _folders_of(root, name):
        path = root / folder / RECORD_FILE
        if path.is_file():
            with contextlib.suppress(RecordError):
                records.append(_load_file(path))
    return sorted(records, key=lambda r: (r.created_at, r.run_id))


def list_summaries(limit: int | None = None) -> tuple[list[RunRecord], int]:
    """The summaries (`records.index`: no packages, task or options) of the records on this
    machine, oldest first; with `limit`, of the newest `limit` only; and how many records
    there are. The index answers for each record whose file it knows unchanged."""
    root = layout.records_root()
    if not root.is_dir():
        return [], 0
    files = {f: f"{root}/{f}/{RECORD_FILE}" for f in _folders_of(root, None)}
    found = index.entries(files, complete=True)
    order = index.readable(found)
    picked = order[-limit:] if limit else order
    return index.summaries(found, [run_id for _, run_id in picked]), len(order)


def _folders_of(root: Path, name: str | None) -> Iterator[str]:
    """The record folders (of run `name` only: `<name>-<stamp>-<hex>`, found by bisection)."""
    folders = _record_folders(str(root), root.stat().st_mtime_ns)
    if name is None:
        yield from folders
        return
    of_name, prefix = _id_of_name(name), f"{name}-"
    for folder in itertools.islice(folders, bisect.bisect_left(folders, prefix), None):
        if not folder.startswith(prefix):
            return
        if of_name.match(folder):
            yield folder


@functools.lru_cache(maxsize=8)
def _record_folders(root: str, mtime_ns: int) -> tuple[str, ...]:
    """The record folders' names, listed once per change of the folder (a new record changes
    its mtime): `status` and the web view ask for each run's records, one run at a time."""
    del mtime_ns  # the cache key only
    return tuple(sorted(os.listdir(root)))


def list_bucket_records(uri: str) -> list[RunRecord]:
    """Every record stored under a bucket URL (e.g. `s3://team-ckpt`), oldest first."""
    from mncloud.storage import open_bucket

    bucket, prefix = open_bucket(uri)
    records = []
    for obj in bucket.list(prefix):
        parts = obj.key.split("/")
        if len(parts) >= 3 and parts[-1] == RECORD_FILE and parts[-3] == layout.RUNS_DIR:
            with contextlib.suppress(Exception):
                records.append(RunRecord.model_validate_json(bucket.get_bytes(obj.key)))
    return sorted(records, key=lambda r: r.created_at)


def fetch_record(ckpt_uri: str, run_id: str) -> RunRecord | None:
    """Run `run_id`'s record from its bucket copy beside the checkpoints (`ckpt_uri`), kept on
    this machine too; None when the bucket has none or cannot be read. A machine that never
    held the record (a deadline controller restarted on a fresh VM) gets it back this way."""
    from mncloud.storage import join_key, open_bucket

    try:
        bucket, prefix = open_bucket(
            layout.record_uri(ckpt_uri, run_id), retry_seconds=BUCKET_RETRY_SECONDS
        )
        payload = bucket.get_bytes(join_key(prefix, RECORD_FILE))
        record = RunRecord.model_validate_json(payload)
    except Exception as err:  # missing or unreadable: the caller goes on without it
        log.warning("run record %s not read from %s: %s", run_id, ckpt_uri, err)
        return None
    path = layout.record_dir(record.run_id) / RECORD_FILE
    write_atomic(path, payload)
    index.note(record.run_id, path, json.loads(payload))
    return record


def find_record(ref: str, bucket: str | None = None) -> RunRecord:
    """The record a user means by `ref`: a run id, a unique id prefix, or a run name (newest).

    Looks on this machine, then under `bucket` when given.
    """
    if bucket is None:  # by id or by name: the one record, not every record parsed
        path = layout.records_root() / ref / RECORD_FILE
        if ref.strip(".") and "/" not in ref and path.is_file():
            with contextlib.suppress(RecordError):
                return _load_file(path)
        with contextlib.suppress(RunNotFoundError):
            found = load_current(ref)
            if found.name == ref:
                return found
    records = list_records()
    if bucket:
        known = {r.run_id for r in records}
        records += [r for r in list_bucket_records(bucket) if r.run_id not in known]
    exact = [r for r in records if r.run_id == ref]
    if exact:
        return exact[-1]
    by_name = [r for r in records if r.name == ref]
    if by_name:
        return max(by_name, key=lambda r: r.created_at)
    prefixed = [r for r in records if r.run_id.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    if len(prefixed) > 1:
        ids = ", ".join(r.run_id for r in prefixed[:5])
        raise RecordError(f"run {ref!r} is ambiguous: {ids}; give more of the id")
    hint = "mncloud runs ls" + (" --bucket URL" if not bucket else "")
    raise RunNotFoundError(f"no run record {ref!r}; see `{hint}`")


def load_diff(record: RunRecord) -> bytes:
    """The stored `git diff HEAD` of a record (b"" for a clean tree)."""
    if record.git is None or record.git.diff_sha256 is None:
        return b""
    path = layout.record_dir(record.run_id) / DIFF_FILE
    if path.is_file():
        return path.read_bytes()
    if record.bucket_uri:
        from mncloud.storage import join_key, open_bucket

        with contextlib.suppress(Exception):
            bucket, prefix = open_bucket(record.bucket_uri, retry_seconds=BUCKET_RETRY_SECONDS)
            return bucket.get_bytes(join_key(prefix, DIFF_FILE))
    raise RecordError(f"the diff of run {record.run_id} is missing locally and in the bucket")


def load_current(name: str, *, before: float | None = None) -> RunRecord:
    """The newest record of run `name` on this machine (the run `up` launched last), or the
    newest created `before` a time (the previous run of its lineage): found through the index
    (`records.index`), the one record parsed."""
    root = layout.records_root()
    if root.is_dir():
        files = {f: f"{root}/{f}/{RECORD_FILE}" for f in _folders_of(root, name)}
        found = index.entries(files)
        for created, run_id in reversed(index.readable(found)):
            if before is None or created < before:
                with contextlib.suppress(RecordError):
                    return _load_file(Path(files[run_id]))
    raise RunNotFoundError(f"run {name!r} has no record on this machine")


def _record_of(name: str, run_id: str) -> RunRecord:
    for record in reversed(list_records(name)):
        if record.run_id == run_id:
            return record
    raise RunNotFoundError(f"run {name!r} has no record {run_id} on this machine")


def append_event(
    name: str,
    kind: EventKind,
    *,
    node: int | None = None,
    cloud: str | None = None,
    region: str | None = None,
    instance_type: str | None = None,
    spot: bool | None = None,
    hourly_price: float | None = None,
    step: int | None = None,
    detail: str = "",
    at: float | None = None,
    run_id: str | None = None,
) -> RunRecord | None:
    """Append one event to run `name`'s current record (or its record `run_id`, an earlier
    launch's) and write it out.

    For a segment-opening event, missing placement fields are taken from the previous opening
    event. Returns the updated record, or None (with a log line) when the run has no record:
    recording must never break a run.
    """
    placement = {
        "cloud": cloud,
        "region": region,
        "instance_type": instance_type,
        "spot": spot,
        "hourly_price": hourly_price,
    }
    try:
        with _locked(name):
            record = load_current(name) if run_id is None else _record_of(name, run_id)
            previous = next((e for e in reversed(record.events) if e.kind in OPENS_SEGMENT), None)
            if kind in OPENS_SEGMENT and previous is not None:
                for key in _PLACEMENT:
                    if placement[key] is None:
                        placement[key] = getattr(previous, key)
            record.events.append(
                Event(
                    kind=kind,
                    time=time.time() if at is None else at,
                    node=node,
                    step=step,
                    detail=detail,
                    **placement,
                )
            )
            save_record(record)
            return record
    except MncloudError as err:
        log.warning("event %s not recorded for run %s: %s", kind, name, err)
        return None


def record_bandwidth(name: str, run_id: str, figures: dict[str, Any]) -> None:
    """The preflight's bandwidth test into run `run_id`'s current record (under its lock);
    best effort: a failure is logged, never raised."""
    try:
        with _locked(name):
            record = load_current(name)
            if record.run_id == run_id and record.bandwidth != figures:
                record.bandwidth = figures
                save_record(record)
    except MncloudError as err:
        log.warning("bandwidth not recorded for run %s: %s", name, err)


def record_export(name: str, run_id: str, ckpt_uri: str, *, step: int, detail: str) -> None:
    """An `export` event (`up --export-on-finish`) in run `run_id`'s record: appended to this
    machine's copy when it holds that record (the local backend; the bucket copy follows),
    else to the bucket copy beside the checkpoints (a cloud node). Best effort, like every
    record write: a failure is logged, never raised."""
    try:
        local = load_current(name)
    except MncloudError:
        local = None
    if local is not None and local.run_id == run_id:
        append_event(name, "export", step=step, detail=detail)
        return
    from mncloud.storage import join_key, open_bucket

    uri = layout.record_uri(ckpt_uri, run_id)
    try:
        bucket, prefix = open_bucket(uri, retry_seconds=BUCKET_RETRY_SECONDS)
        key = join_key(prefix, RECORD_FILE)
        record = RunRecord.model_validate_json(bucket.get_bytes(key))
        record.events.append(Event(kind="export", time=time.time(), step=step, detail=detail))
        bucket.put_bytes(key, _serialize(record))
    except Exception as err:  # the record must never fail an export
        log.warning("export not recorded in run record %s: %s", uri, err)
