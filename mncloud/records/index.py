"""The record index: one file that summarises every run record on this machine, so that
`status`, `runs ls`, `runs cost` and the web view find a run's newest record and list records
without opening and parsing each one.

`layout.records_index()` holds, per record folder, its `run.json`'s stat (mtime in ns, size,
inode), its run's name and creation time, and a summary: the record without what listings
never show (packages, task YAML, launch options, the spec but its bucket and `--ckpt-dir`,
the plan but its choice's place, price and estimate). The record store updates its entry on
every write (`note`, under a lock); a reader takes an entry only while its file's stat is the
same, and reads the record itself otherwise (a write from an older mncloud, a copied folder,
a torn or lost index), then writes the fresh entries back. So a stale index costs one parse
per changed record and never gives a wrong listing, and a folder the index does not know is
read and shown. An unreadable record is noted as such and left out, as `store.list_records`
leaves it out. Example: 1,000 records of a run, one new event appended:

    status RUN    stats the run's 1,000 run.json files, parses the newest one (its event)
    runs ls       stats all records, reads the index, validates the newest `--limit` summaries
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from mncloud import layout
from mncloud.records.model import RunRecord
from mncloud.storage import write_atomic

log = logging.getLogger(__name__)

VERSION = 1
#: How long a writer waits for the index's lock before it leaves the update to readers.
LOCK_S = 2.0
#: The spec's keys a summary keeps (what `RunRecord.ckpt_uri` and `status` read).
SPEC_KEYS = ("bucket", "ckpt_dir")
#: The plan choice's keys a summary keeps (what the cost ledger and `runs cost` read).
CHOICE_KEYS = ("cloud", "region", "instance_type", "expected_cost", "hourly_total")

Entry = dict[str, Any]


def summary_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """A record's summary from its JSON (as written: redacted): what listings show, without
    the values a record has by default (each `null`, each event's)."""
    heavy = {"packages", "task_yaml", "launch_options", "plan", "spec", "events"}
    out = {k: v for k, v in data.items() if k not in heavy and v not in (None, {}, [])}
    out["events"] = [
        {k: v for k, v in e.items() if v is not None and v != ""} if isinstance(e, dict) else e
        for e in data.get("events") or []
    ]
    spec = data.get("spec") or {}
    out["spec"] = {k: spec[k] for k in SPEC_KEYS if k in spec}
    out["task_yaml"] = ""
    plan = data.get("plan")
    if isinstance(plan, Mapping):
        choice = plan.get("choice") or {}
        out["plan"] = {"choice": {k: choice[k] for k in CHOICE_KEYS if k in choice}}
    return out


def stat_of(path: str | Path) -> list[int] | None:
    """What tells a record file's versions apart: mtime (ns), size, inode; None if missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def entry_of(data: Mapping[str, Any], stat: list[int]) -> Entry:
    return {"stat": stat, "name": data.get("name"), "created_at": data.get("created_at"),
            "summary": summary_of(data)}  # fmt: skip


def _read(path: str | Path, stat: list[int]) -> Entry:
    """A record file's entry, read now (`bad` when it is not a readable record)."""
    try:
        data = json.loads(Path(path).read_bytes())
        RunRecord.model_validate(data)
    except (OSError, ValueError, TypeError):
        return {"stat": stat, "bad": True}
    return entry_of(data, stat)


_loaded: dict[str, tuple[list[int], dict[str, Entry]]] = {}


def _load() -> dict[str, Entry]:
    """The index's entries (a copy); none when it is missing, torn or of another version.
    Parsed once a process for each version of the file (its stat)."""
    path = layout.records_index()
    stat = stat_of(path)
    seen = _loaded.get(str(path))
    if stat is not None and seen is not None and seen[0] == stat:
        return dict(seen[1])
    entries: dict[str, Entry] = {}
    try:
        raw = json.loads(path.read_bytes())
        if raw.get("v") == VERSION and isinstance(raw.get("entries"), dict):
            entries = raw["entries"]
    except (OSError, ValueError, AttributeError):
        pass
    if stat is not None:
        _loaded.clear()
        _loaded[str(path)] = (stat, entries)
    return dict(entries)


def _update(fresh: Mapping[str, Entry], keep: set[str] | None = None) -> None:
    """Merge `fresh` entries into the index under its lock (best effort; with `keep`, drop
    the entries of folders not in it: a full listing's)."""
    folder = layout.record_locks_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(folder / "index.lock", timeout=LOCK_S):
            entries = _load()
            entries.update(fresh)
            if keep is not None:
                entries = {k: v for k, v in entries.items() if k in keep}
            text = json.dumps({"v": VERSION, "entries": entries}, separators=(",", ":"))
            write_atomic(layout.records_index(), text)
    except (OSError, Timeout) as err:
        log.debug("record index not updated: %s", err)


def note(run_id: str, path: str | Path, data: Mapping[str, Any]) -> None:
    """A record just written to `path` (its JSON `data`) into the index."""
    stat = stat_of(path)
    if stat is not None:
        _update({run_id: entry_of(data, stat)})


def entries(files: Mapping[str, str], *, complete: bool = False) -> dict[str, Entry]:
    """Each record folder's entry (folder → its run.json), fresh: the index's while the
    file's stat is the one it holds, else read now; entries read now are written back
    (`complete`: `files` is every record, so entries of removed folders are dropped)."""
    known = _load()
    out: dict[str, Entry] = {}
    fresh: dict[str, Entry] = {}
    for folder, path in files.items():
        stat = stat_of(path)
        if stat is None:
            continue
        entry = known.get(folder)
        if not isinstance(entry, dict) or entry.get("stat") != stat:
            entry = fresh[folder] = _read(path, stat)
        out[folder] = entry
    if fresh or (complete and set(known) - set(files)):
        _update(fresh, set(files) if complete else None)
    return out


def readable(found: Mapping[str, Entry]) -> list[tuple[float, str]]:
    """(created_at, run id) of the readable records among `found`, oldest first."""
    out = []
    for run_id, entry in found.items():
        if not entry.get("bad"):
            with contextlib.suppress(TypeError, ValueError):
                out.append((float(entry["created_at"]), run_id))
    return sorted(out)


def summaries(found: Mapping[str, Entry], run_ids: Iterable[str]) -> list[RunRecord]:
    """The summaries of `run_ids` as records (no packages, task, options; see the module
    docstring); one that does not validate is left out."""
    out = []
    for run_id in run_ids:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            out.append(RunRecord.model_validate(found[run_id]["summary"]))
    return out
