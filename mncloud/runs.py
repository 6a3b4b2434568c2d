"""Run records: what ran (lineage), where and at what price (cost ledger), how fast (stragglers).

At `up` a record is created for the run and written twice: on this machine
(`$MNCLOUD_HOME/records/<run-id>/run.json`) and in the bucket beside the checkpoints
(`<bucket>/<name>/runs/<run-id>/run.json`), each with the uncommitted diff as `diff.patch`
beside it. The bucket copy outlives the laptop; the local copy outlives a lost bucket. A bucket
failure never breaks a run: it is logged and the local copy still holds everything. Local
records live outside the run folder `$MNCLOUD_HOME/runs/<name>/` on purpose: a backend replaces
that folder when a name is launched again, and the record of the earlier run must survive it.
Run ids are `<name>-<UTC time>-<6 hex>`, so a name's newest record is its current one.

Lineage: the git commit, a sha256 and a copy of `git diff HEAD --binary` (tracked changes, staged
or not), the untracked files with their sha256 (they are not in the diff; `rerun` copies them
from the current checkout only when their hashes still match), the JobSpec, the rendered task
YAML, the plan, the launching environment's packages (`importlib.metadata`, no `pip freeze`
subprocess), the image and labels.

The ledger is a list of events a backend appends (`append_event`). Segments of billed time are
read off it (`cost_segments`); an example sequence for a 2-node spot job:

    launch      t=0     aws p5.48xlarge spot $40/h   ─┐ segment 1: 2.0 h × $40 = $80
    checkpoint  t=1.5h  step 3000                      │
    preemption  t=2h    node 1                        ─┘
    recovery    t=2.2h  gcp a3-highgpu-8g spot $45/h ─┐ segment 2: open, priced until now
    finish      t=5h                                  ─┘           (or its end): 2.8 h × $45

`launch`, `recovery` (relaunch after a preemption) and `restart` (relaunch after an error) open
a segment at the event's `hourly_price` (the whole job's $/h); `preemption`, `failure` and
`finish` close it; a new opening event also closes an open one. The gap between a preemption and
the recovery is not billed: a managed job tears the cluster down and provisions a new one, and
the provisioning time is what SkyPilot bills least predictably — a backend that knows better
sends its `recovery` event when provisioning starts.

Secrets never reach a record. Every string is scrubbed (`Redactor`) before it is written: the
values of the spec's `--secret` names and of any variable (in `--env` or in the launching
environment) whose name looks sensitive (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*_KEY`, …), and
anything shaped like a credential (AWS key ids, private-key blocks, GitHub/Hugging Face/Slack
tokens, JWTs, `user:password@` in URLs). Note `--env` values are rendered into the task YAML by
design (use `--secret` for secrets); the copy of that YAML in the record is scrubbed all the
same. A diff that needed scrubbing cannot be re-applied faithfully: its record says so
(`diff_redacted`) and `rerun` refuses it.

Stragglers: each rank may publish its recent mean step time (`publish_step_time`, torch-free,
rate-limited) to `<record dir>/steps/rank-<r>.json` in the bucket; `step_times` collects them and
`straggler_ranks` names the ranks at least 1.5× slower than the median.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import os
import platform
import re
import secrets as _secrets
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from mncloud import __version__, constants
from mncloud.errors import MncloudError, RunNotFoundError
from mncloud.storage import write_atomic

if TYPE_CHECKING:
    from mncloud.render import RenderedTask
    from mncloud.spec import JobSpec

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
RECORD_FILE = "run.json"
DIFF_FILE = "diff.patch"
RECORDS_DIR = "records"
LOCKS_DIR = ".locks"
#: Environment variable carrying the run id to every node (render adds it to the task envs).
RUN_ID_ENV = constants.RUN_ID_ENV
#: A rank at least this many times slower than the median step time is a straggler.
STRAGGLER_FACTOR = 1.5
#: Record writes to the bucket give up after this long (the local copy is always written).
BUCKET_RETRY_SECONDS = 5.0
#: Untracked files above this size are listed without a hash (and cannot be restored).
MAX_HASHED_FILE = 32 * 1024 * 1024
REDACTED = "<redacted>"

EventKind = Literal[
    "launch", "preemption", "recovery", "restart", "checkpoint", "finish", "failure"
]
OPENS_SEGMENT = ("launch", "recovery", "restart")
CLOSES_SEGMENT = ("preemption", "failure", "finish")


class RecordError(MncloudError):
    """A run record is missing, unreadable or cannot serve the request."""


# --------------------------------------------------------------------------- models


class Event(BaseModel):
    """One thing that happened to a run, with where it ran and at what price."""

    kind: EventKind
    time: float
    """Seconds since the epoch."""
    node: int | None = None
    """The node concerned (a preemption's node), if one."""
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    hourly_price: float | None = None
    """USD per hour for the whole job (all nodes) from this event on."""
    step: int | None = None
    """Training step (checkpoint events)."""
    detail: str = ""


class UntrackedFile(BaseModel):
    """A file git does not track, so the diff does not carry it."""

    path: str
    """Relative to the repository root."""
    size: int
    sha256: str | None = None
    """None above `MAX_HASHED_FILE`."""


class GitInfo(BaseModel):
    """The code a run was launched from."""

    root: str
    """Repository root on the launching machine."""
    commit: str | None
    """HEAD, or None in a repository without commits."""
    branch: str | None = None
    remote: str | None = None
    """`origin`'s URL, credentials removed."""
    diff_sha256: str | None = None
    """sha256 of `git diff HEAD --binary` (None when the tree is clean)."""
    diff_bytes: int = 0
    diff_redacted: bool = False
    """The stored diff had secrets scrubbed out; it cannot be re-applied faithfully."""
    untracked: list[UntrackedFile] = Field(default_factory=list)
    workdir: str = "."
    """The spec's workdir relative to `root`."""

    @property
    def dirty(self) -> bool:
        return self.diff_sha256 is not None or bool(self.untracked)


class RunRecord(BaseModel):
    """Everything needed to reproduce a run and account for its cost."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    name: str
    user: str
    host: str
    created_at: float
    mncloud_version: str = __version__
    python: str = ""
    backend: str
    nodes: int = 1
    git: GitInfo | None = None
    spec: dict[str, Any]
    task_yaml: str
    plan: dict[str, Any] | None = None
    packages: dict[str, str] = Field(default_factory=dict)
    image: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    bucket_uri: str | None = None
    """Where the bucket copy lives: `<bucket>/<name>/runs/<run-id>`, or None."""
    events: list[Event] = Field(default_factory=list)
    step_times: dict[int, float] = Field(default_factory=dict)
    """Newest mean seconds per step, by global rank (from `step_times`)."""

    @property
    def finished(self) -> bool:
        """The last event ended the run (finish, or a failure not followed by a restart)."""
        return bool(self.events) and self.events[-1].kind in ("finish", "failure")

    @property
    def estimate(self) -> float | None:
        """The plan's expected cost for the whole job, if planned."""
        choice = (self.plan or {}).get("choice") or {}
        value = choice.get("expected_cost")
        return float(value) if value is not None else None


class Segment(BaseModel):
    """A stretch of billed time: from a launch/recovery/restart to its end."""

    index: int
    start: float
    end: float
    open: bool
    """Still running: `end` is now."""
    ended_by: str | None
    opened_by: str
    cloud: str | None
    region: str | None
    instance_type: str | None
    spot: bool | None
    hourly_price: float | None
    hours: float
    cost: float | None
    """None when the price is unknown."""


class CostSummary(BaseModel):
    """A run's cost so far by segment and market, against the plan's estimate."""

    run_id: str
    segments: list[Segment]
    total: float
    spot: float
    on_demand: float
    unpriced_hours: float
    """Hours in segments without a known price (not in the totals)."""
    preemptions: int
    restarts: int
    estimate: float | None
    """The plan's expected cost of the whole job."""
    estimate_hourly: float | None


# --------------------------------------------------------------------------- redaction

_SENSITIVE_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|(^|_)KEY$|(^|_)AUTH", re.I
)
_MIN_SECRET_LEN = 6
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
        ),
        REDACTED,
    ),
    (re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # user:password@ in URLs
    (re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"), REDACTED),
    # NAME=value / NAME: value / "name": "value" where NAME looks sensitive
    (
        re.compile(
            r"""(?ix)
            (["']?[A-Z0-9_.-]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY)
             [A-Z0-9_.-]*["']?\s*[:=]\s*["']?)
            (?!<redacted>)[^\s"',}]{6,}"""
        ),
        r"\1" + REDACTED,
    ),
]


class Redactor:
    """Scrubs known secret values and credential-shaped text out of strings."""

    def __init__(self, values: set[str] | None = None) -> None:
        # Longest first, so a value containing another is replaced whole.
        self.values = sorted(
            {v for v in (values or set()) if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True
        )

    def scrub(self, text: str) -> str:
        """`text` with every secret replaced by `<redacted>`."""
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        return text

    def scrub_obj(self, obj: Any) -> Any:
        """A copy of JSON-like data with every string (keys too) scrubbed."""
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, Mapping):
            return {self.scrub_obj(k): self.scrub_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub_obj(v) for v in obj]
        return obj


def is_sensitive_name(name: str) -> bool:
    """Whether an environment variable's name suggests its value is a secret."""
    return bool(_SENSITIVE_NAME.search(name))


def redactor_for(
    secret_names: list[str] | None = None,
    envs: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Redactor:
    """A Redactor for the values of `secret_names` and of sensitive-looking variables.

    `envs` are the spec's `--env` values; `environ` the launching environment (os.environ).
    """
    environ = os.environ if environ is None else environ
    values: set[str] = set()
    for name in secret_names or []:
        if environ.get(name):
            values.add(environ[name])
    for source in (envs or {}, environ):
        for name, value in source.items():
            if value and is_sensitive_name(name):
                values.add(value)
    return Redactor(values)


def spec_redactor(spec: JobSpec | Mapping[str, Any] | None) -> Redactor:
    """The Redactor for a spec (a JobSpec or its JSON), reading secret values from os.environ."""
    if spec is None:
        return redactor_for()
    data = spec if isinstance(spec, Mapping) else spec.model_dump(mode="json")
    return redactor_for(list(data.get("secrets") or []), dict(data.get("envs") or {}))


# --------------------------------------------------------------------------- lineage


def _ID_OF_NAME(name: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(name)}-\d{{8}}T\d{{6}}-[0-9a-f]{{6}}$")


def new_run_id(name: str, now: float | None = None) -> str:
    """`<name>-<UTC yyyymmddThhmmss>-<6 hex>`: sortable, unique, readable."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{name}-{stamp}-{_secrets.token_hex(3)}"


def _git(root: Path, *args: str, binary: bool = False) -> Any:
    proc = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RecordError(f"git {' '.join(args)} failed in {root}: {lines[-1] if lines else ''}")
    return proc.stdout if binary else proc.stdout.decode(errors="replace").strip()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def capture_git(workdir: Path, redactor: Redactor | None = None) -> tuple[GitInfo | None, bytes]:
    """The git state of `workdir`'s repository and the diff to store; (None, b"") outside git."""
    redactor = redactor or Redactor()
    try:
        root = Path(_git(workdir, "rev-parse", "--show-toplevel"))
    except (RecordError, OSError, subprocess.TimeoutExpired):
        return None, b""
    commit: str | None
    try:
        commit = _git(root, "rev-parse", "--verify", "HEAD")
    except RecordError:
        commit = None
    branch = remote = None
    with contextlib.suppress(RecordError):
        branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD") or None
    with contextlib.suppress(RecordError):
        remote = redactor.scrub(_git(root, "remote", "get-url", "origin")) or None
    diff = _git(root, "diff", "HEAD", "--binary", binary=True) if commit else b""
    untracked_raw = _git(root, "ls-files", "--others", "--exclude-standard", "-z", binary=True)
    untracked = []
    for rel in untracked_raw.decode(errors="replace").split("\0"):
        if not rel:
            continue
        path = root / rel
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            digest = _sha256_file(path) if size <= MAX_HASHED_FILE else None
            untracked.append(UntrackedFile(path=redactor.scrub(rel), size=size, sha256=digest))
    stored = diff
    redacted = False
    if diff:
        text = diff.decode(errors="surrogateescape")
        scrubbed = redactor.scrub(text)
        if scrubbed != text:
            redacted = True
            stored = scrubbed.encode(errors="surrogateescape")
    try:
        rel_workdir = Path(workdir).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel_workdir = "."
    info = GitInfo(
        root=str(root),
        commit=commit,
        branch=branch,
        remote=remote,
        diff_sha256=hashlib.sha256(diff).hexdigest() if diff else None,
        diff_bytes=len(diff),
        diff_redacted=redacted,
        untracked=untracked,
        workdir=rel_workdir,
    )
    return info, stored


def installed_packages() -> dict[str, str]:
    """`name → version` of every distribution in this environment (like `pip freeze`)."""
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


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
    now: float | None = None,
    save: bool = True,
) -> RunRecord:
    """Build the run's record at `up` and (with `save`) write it locally and to the bucket.

    `task` is the RenderedTask (or its YAML text); `plan` a `mncloud.plan.Plan`, its JSON, or
    None. Pass `run_id` when the task was rendered with it (see `RUN_ID_ENV`).
    """
    now = time.time() if now is None else now
    redactor = spec_redactor(spec)
    git, diff = capture_git(spec.workdir, redactor)
    plan_data: dict[str, Any] | None = None
    if plan is not None:
        plan_data = plan.to_json(top=10) if hasattr(plan, "to_json") else dict(plan)
    run_id = run_id or new_run_id(spec.name, now)
    bucket_uri = spec.bucket.child(spec.name, "runs", run_id) if spec.bucket else None
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
        task_yaml=task if isinstance(task, str) else task.yaml_text,
        plan=plan_data,
        packages=installed_packages(),
        image=spec.image,
        labels=dict(spec.labels),
        bucket_uri=bucket_uri,
    )
    if save:
        save_record(record, diff=diff)
    return record


# --------------------------------------------------------------------------- storage


def records_root() -> Path:
    """The local folder of all run records: `$MNCLOUD_HOME/records/<run-id>/`."""
    from mncloud.catalog import mncloud_home

    return mncloud_home() / RECORDS_DIR


def record_dir(run_id: str) -> Path:
    """The local folder of one run record."""
    return records_root() / run_id


def _serialize(record: RunRecord) -> bytes:
    data = spec_redactor(record.spec).scrub_obj(record.model_dump(mode="json"))
    return (json.dumps(data, indent=2) + "\n").encode()


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock on a run's record (several processes may append events)."""
    import fcntl

    folder = records_root() / LOCKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_record(record: RunRecord, *, diff: bytes | None = None) -> None:
    """Write the record (and `diff`) locally, atomically, then to the bucket (best effort)."""
    folder = record_dir(record.run_id)
    payload = _serialize(record)
    write_atomic(folder / RECORD_FILE, payload)
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
    root = records_root()
    if not root.is_dir():
        return []
    records = []
    for path in root.glob(f"*/{RECORD_FILE}"):
        if name is not None and not _ID_OF_NAME(name).match(path.parent.name):
            continue
        with contextlib.suppress(RecordError):
            records.append(_load_file(path))
    return sorted(records, key=lambda r: (r.created_at, r.run_id))


def list_bucket_records(uri: str) -> list[RunRecord]:
    """Every record stored under a bucket URL (e.g. `s3://team-ckpt`), oldest first."""
    from mncloud.storage import open_bucket

    bucket, prefix = open_bucket(uri)
    records = []
    for obj in bucket.list(prefix):
        parts = obj.key.split("/")
        if len(parts) >= 3 and parts[-1] == RECORD_FILE and parts[-3] == "runs":
            with contextlib.suppress(Exception):
                records.append(RunRecord.model_validate_json(bucket.get_bytes(obj.key)))
    return sorted(records, key=lambda r: r.created_at)


def find_record(ref: str, bucket: str | None = None) -> RunRecord:
    """The record a user means by `ref`: a run id, a unique id prefix, or a run name (newest).

    Looks on this machine, then under `bucket` when given.
    """
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
    path = record_dir(record.run_id) / DIFF_FILE
    if path.is_file():
        return path.read_bytes()
    if record.bucket_uri:
        from mncloud.storage import join_key, open_bucket

        with contextlib.suppress(Exception):
            bucket, prefix = open_bucket(record.bucket_uri, retry_seconds=BUCKET_RETRY_SECONDS)
            return bucket.get_bytes(join_key(prefix, DIFF_FILE))
    raise RecordError(f"the diff of run {record.run_id} is missing locally and in the bucket")


def load_current(name: str) -> RunRecord:
    """The newest record of run `name` on this machine (the run `up` launched last)."""
    found = list_records(name)
    if not found:
        raise RunNotFoundError(f"run {name!r} has no record on this machine")
    return found[-1]


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
) -> RunRecord | None:
    """Append one event to run `name`'s current record and write it out.

    For a segment-opening event, missing placement fields are taken from the previous opening
    event. Returns the updated record, or None (with a log line) when the run has no record:
    recording must never break a run.
    """
    try:
        with _locked(name):
            record = load_current(name)
            previous = next((e for e in reversed(record.events) if e.kind in OPENS_SEGMENT), None)
            if kind in OPENS_SEGMENT and previous is not None:
                cloud = cloud if cloud is not None else previous.cloud
                region = region if region is not None else previous.region
                instance_type = (
                    instance_type if instance_type is not None else previous.instance_type
                )
                spot = spot if spot is not None else previous.spot
                hourly_price = hourly_price if hourly_price is not None else previous.hourly_price
            record.events.append(
                Event(
                    kind=kind,
                    time=time.time() if at is None else at,
                    node=node,
                    cloud=cloud,
                    region=region,
                    instance_type=instance_type,
                    spot=spot,
                    hourly_price=hourly_price,
                    step=step,
                    detail=detail,
                )
            )
            save_record(record)
            return record
    except MncloudError as err:
        log.warning("event %s not recorded for run %s: %s", kind, name, err)
        return None


# --------------------------------------------------------------------------- cost


def cost_segments(record: RunRecord, now: float | None = None) -> list[Segment]:
    """The run's billed segments (see the module docstring), the open one priced until now."""
    now = time.time() if now is None else now
    segments: list[Segment] = []
    opened: Event | None = None

    def close(end: float, by: str | None, is_open: bool) -> None:
        assert opened is not None
        hours = max(0.0, end - opened.time) / 3600.0
        price = opened.hourly_price
        segments.append(
            Segment(
                index=len(segments) + 1,
                start=opened.time,
                end=end,
                open=is_open,
                ended_by=by,
                opened_by=opened.kind,
                cloud=opened.cloud,
                region=opened.region,
                instance_type=opened.instance_type,
                spot=opened.spot,
                hourly_price=price,
                hours=hours,
                cost=None if price is None else price * hours,
            )
        )

    for event in sorted(record.events, key=lambda e: e.time):
        if event.kind in OPENS_SEGMENT:
            if opened is not None:
                close(event.time, event.kind, False)
            opened = event
        elif event.kind in CLOSES_SEGMENT and opened is not None:
            close(event.time, event.kind, False)
            opened = None
    if opened is not None:
        close(max(now, opened.time), None, True)
    return segments


def cost_summary(record: RunRecord, now: float | None = None) -> CostSummary:
    """Cost so far, split by segment and by spot vs on-demand, against the plan's estimate."""
    segments = cost_segments(record, now)
    spot = sum(s.cost or 0.0 for s in segments if s.spot)
    on_demand = sum(s.cost or 0.0 for s in segments if not s.spot)
    choice = (record.plan or {}).get("choice") or {}
    return CostSummary(
        run_id=record.run_id,
        segments=segments,
        total=spot + on_demand,
        spot=spot,
        on_demand=on_demand,
        unpriced_hours=sum(s.hours for s in segments if s.cost is None),
        preemptions=sum(e.kind == "preemption" for e in record.events),
        restarts=sum(e.kind in ("recovery", "restart") for e in record.events),
        estimate=record.estimate,
        estimate_hourly=choice.get("hourly_total"),
    )


def observed_spot_hazard(
    records: list[RunRecord] | None = None, min_node_hours: float = 1.0
) -> dict[str, tuple[float, int, float]]:
    """Observed spot preemptions per node-hour by cloud: `cloud → (hazard, count, node_hours)`.

    Feeds the planner's `--learn`: a preemption counts against the spot segment it ended. Clouds
    with fewer than `min_node_hours` of spot time are left out (too little to learn from).
    """
    records = list_records() if records is None else records
    totals: dict[str, list[float]] = {}
    for record in records:
        for seg in cost_segments(record):
            if not seg.spot or not seg.cloud:
                continue
            entry = totals.setdefault(seg.cloud, [0.0, 0.0])
            entry[0] += seg.ended_by == "preemption"
            entry[1] += seg.hours * record.nodes
    return {
        cloud: (count / hours, int(count), hours)
        for cloud, (count, hours) in totals.items()
        if hours >= min_node_hours
    }


# --------------------------------------------------------------------------- stragglers


def straggler_ranks(step_times: Mapping[int, float], factor: float = STRAGGLER_FACTOR) -> list[int]:
    """Ranks whose step time is at least `factor` × the median of all ranks, sorted."""
    values = [t for t in step_times.values() if t > 0]
    if len(values) < 2:
        return []
    median = statistics.median(values)
    return sorted(r for r, t in step_times.items() if t >= factor * median)


_last_publish: dict[int, float] = {}


def publish_step_time(
    seconds_per_step: float,
    step: int,
    *,
    rank: int | None = None,
    min_interval: float = 30.0,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Publish this rank's recent mean step time to the run's bucket (at most every 30 s).

    Reads the checkpoint URL, run id and rank from the environment (`MNCLOUD_CKPT_URI`,
    `MNCLOUD_RUN_ID`, `RANK`); returns False (doing nothing) when one is missing, when called
    again too soon, or when the bucket fails: a report must never slow or break training.
    """
    env = os.environ if environ is None else environ
    uri, run_id = env.get(constants.CKPT_URI_ENV), env.get(RUN_ID_ENV)
    rank = int(env.get("RANK", "0")) if rank is None else rank
    if not uri or not run_id:
        return False
    now = time.monotonic()
    if now - _last_publish.get(rank, -1e18) < min_interval:
        return False
    _last_publish[rank] = now
    from mncloud.storage import join_key, open_bucket

    body = {"rank": rank, "step": step, "seconds_per_step": seconds_per_step, "time": time.time()}
    try:
        bucket, prefix = open_bucket(f"{uri.rstrip('/')}/runs/{run_id}", retry_seconds=2.0)
        bucket.put_bytes(join_key(prefix, "steps", f"rank-{rank}.json"), json.dumps(body).encode())
    except Exception as err:
        log.debug("step time not published: %s", err)
        return False
    return True


def step_times(record: RunRecord, ckpt_uri: str | None = None) -> dict[int, float]:
    """The newest published step time of every rank (from the bucket), or the stored ones.

    Ranks publish under `$MNCLOUD_CKPT_URI/runs/<run-id>`: the record's bucket copy, or, for a
    run without `--bucket` (a local run's checkpoint folder), under `ckpt_uri` when given.
    """
    uri = record.bucket_uri
    if not uri and ckpt_uri:
        uri = f"{ckpt_uri.rstrip('/')}/runs/{record.run_id}"
    if not uri:
        return dict(record.step_times)
    from mncloud.storage import join_key, open_bucket

    found: dict[int, float] = {}
    try:
        bucket, prefix = open_bucket(uri, retry_seconds=BUCKET_RETRY_SECONDS)
        for obj in bucket.list(join_key(prefix, "steps") + "/"):
            data = json.loads(bucket.get_bytes(obj.key))
            found[int(data["rank"])] = float(data["seconds_per_step"])
    except Exception as err:
        log.warning("step times not read from %s: %s", uri, err)
        return dict(record.step_times)
    return found or dict(record.step_times)


def straggler_note(step_times: Mapping[int, float], ranks: list[int]) -> str:
    """`straggler rank 3 (1.8× median)`, or "" without stragglers."""
    values = [t for t in step_times.values() if t > 0]
    if not ranks or not values:
        return ""
    median = statistics.median(values)
    parts = [f"rank {r} ({step_times[r] / median:.1f}× median)" for r in ranks]
    return ("straggler " if len(parts) == 1 else "stragglers ") + ", ".join(parts)


# --------------------------------------------------------------------------- rerun


class RerunSetup(BaseModel):
    """A reconstructed working tree and the options to launch the recorded spec from it."""

    worktree: Path
    workdir: Path
    options: dict[str, Any]
    """Keyword options for `mncloud up` (see `up_options`)."""
    restored_untracked: list[str] = Field(default_factory=list)
    skipped_untracked: list[str] = Field(default_factory=list)


def _repo_root(start: Path) -> Path | None:
    try:
        return Path(_git(start, "rev-parse", "--show-toplevel"))
    except (RecordError, OSError, subprocess.TimeoutExpired):
        return None


def prepare_rerun(
    record: RunRecord,
    dest: Path,
    *,
    repo: Path | None = None,
    env_overrides: Mapping[str, str] | None = None,
    skip_untracked: bool = False,
) -> RerunSetup:
    """Rebuild the run's code in a new git worktree at `dest`: its commit + its stored diff.

    `repo` is the repository to take the commit from (default: the current directory's, else
    the recorded root). Untracked files are copied from that checkout only if their sha256 still
    matches. Raises RecordError with one line whenever the tree cannot be reconstructed exactly;
    the current checkout is never modified.
    """
    g = record.git
    if g is None:
        raise RecordError(
            f"run {record.run_id} was not launched from a git repository; there is no commit "
            "to rebuild its code from"
        )
    if g.commit is None:
        raise RecordError(f"run {record.run_id} was launched before the repository's first commit")
    if g.diff_redacted:
        raise RecordError(
            f"run {record.run_id}'s uncommitted diff contained secrets and was stored scrubbed; "
            "it cannot be re-applied exactly"
        )
    root = repo or _repo_root(Path.cwd()) or (Path(g.root) if Path(g.root).is_dir() else None)
    if root is None or _repo_root(root) is None:
        raise RecordError(
            "not inside a git repository: run `mncloud rerun` from a clone of the run's project"
        )
    root = _repo_root(root) or root
    try:
        _git(root, "cat-file", "-e", f"{g.commit}^{{commit}}")
    except RecordError:
        raise RecordError(
            f"commit {g.commit[:12]} of run {record.run_id} is not in {root}; "
            f"fetch it first (git fetch origin {g.commit})"
        ) from None
    spec = dict(record.spec)
    envs = dict(spec.get("envs") or {})
    for key, value in envs.items():
        if REDACTED in value:
            if not env_overrides or key not in env_overrides:
                raise RecordError(
                    f"--env {key} was redacted in the record; pass it again: --env {key}=VALUE"
                )
            envs[key] = env_overrides[key]
    envs.update(env_overrides or {})
    diff = load_diff(record)
    if g.diff_sha256 and hashlib.sha256(diff).hexdigest() != g.diff_sha256:
        raise RecordError(f"the stored diff of run {record.run_id} does not match its sha256")
    untracked_plan: list[tuple[UntrackedFile, Path]] = []
    skipped: list[str] = []
    for item in g.untracked:
        source = root / item.path
        ok = source.is_file() and item.sha256 is not None and _sha256_file(source) == item.sha256
        if ok:
            untracked_plan.append((item, source))
        elif skip_untracked:
            skipped.append(item.path)
        else:
            why = "missing" if not source.is_file() else "changed since the run"
            raise RecordError(
                f"untracked file {item.path} is {why}; restore it or pass --skip-untracked"
            )
    if dest.exists():
        raise RecordError(f"{dest} already exists; choose another --name or remove it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _git(root, "worktree", "add", "--detach", "--quiet", str(dest), g.commit)
    try:
        if diff:
            patch = dest.parent / f".{dest.name}.patch"
            patch.write_bytes(diff)
            try:
                _git(dest, "apply", "--binary", "--whitespace=nowarn", str(patch))
            finally:
                patch.unlink(missing_ok=True)
        for item, source in untracked_plan:
            target = dest / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    except RecordError as err:
        with contextlib.suppress(Exception):
            _git(root, "worktree", "remove", "--force", str(dest))
        raise RecordError(f"could not rebuild run {record.run_id}'s tree: {err}") from None
    workdir = dest / g.workdir
    old_workdir = Path(spec["workdir"])
    script = workdir / Path(spec["script"]).relative_to(old_workdir)
    return RerunSetup(
        worktree=dest,
        workdir=workdir,
        options=up_options(spec | {"envs": envs}, script, workdir, record.plan),
        restored_untracked=[i.path for i, _ in untracked_plan],
        skipped_untracked=skipped,
    )


def up_options(
    spec: Mapping[str, Any], script: Path, workdir: Path, plan: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A recorded spec (JSON) as the keyword options of `mncloud up`'s command function."""
    accel = spec["accelerator"]
    spot = {"spot": True, "on-demand": False}.get(spec.get("spot", "either"))
    bucket = spec.get("bucket")
    bucket_url = None
    if bucket:
        if bucket["scheme"] == "file":
            bucket_url = f"file://{bucket['name']}"
        else:
            bucket_url = f"{bucket['scheme']}://{bucket['name']}"
            bucket_url += f"/{bucket['prefix']}" if bucket.get("prefix") else ""
    request = (plan or {}).get("request") or {}
    return {
        "script": script,
        "script_args": list(spec.get("script_args") or []) or None,
        "gpus": f"{accel['name']}:{accel['count']}",
        "nodes": spec.get("nodes"),
        "spot": spot,
        "cloud": list(spec.get("clouds") or []) or None,
        "region": list(spec.get("regions") or []) or None,
        "bucket": bucket_url,
        "mount_bucket": bool(spec.get("mount_bucket")),
        "env": [f"{k}={v}" for k, v in (spec.get("envs") or {}).items()] or None,
        "secret": list(spec.get("secrets") or []) or None,
        "setup": spec.get("setup"),
        "requirements": str(workdir / spec["requirements"]) if spec.get("requirements") else None,
        "disk_size": spec.get("disk_size"),
        "image": spec.get("image"),
        "label": [f"{k}={v}" for k, v in (spec.get("labels") or {}).items()] or None,
        "max_hourly": spec.get("max_hourly"),
        "max_restarts": spec.get("max_restarts"),
        "master_port": spec.get("master_port"),
        "nccl_debug": spec.get("nccl_debug"),
        "nccl_socket_ifname": spec.get("nccl_socket_ifname"),
        "hours": float(request.get("hours") or 24.0),
        "max_cost": request.get("max_cost"),
    }
