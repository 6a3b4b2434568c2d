"""The record index (`mncloud/records/index.py`): `status NAME` opens the run's newest record
whether it has 1 record or 150, `runs ls` opens none (the index answers, counted, never
timed); a torn, stale or lost index, a record written behind its back, a copied or removed
folder never make a listing other than reading every record would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from mncloud import layout
from mncloud.cli import app
from mncloud.records.model import Event, RunRecord
from mncloud.records.store import (
    RECORD_FILE,
    find_record,
    list_records,
    list_summaries,
    load_current,
    save_record,
)
from mncloud.storage import write_atomic
from tests.longrun import launches_of, local_run, opened_under


def _cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def _older(record: RunRecord, count: int, name: str | None = None) -> list[str]:
    """`count` records of `record`'s run (or of run `name`) before it, as `up` made them."""
    ids = []
    for i in range(count):
        who = name or record.name
        run_id = f"{who}-20231113T{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
        when = record.created_at - 1e5 + i
        save_record(record.model_copy(update={"run_id": run_id, "name": who, "created_at": when}))
        ids.append(run_id)
    return ids


def _records_opened(*args: str) -> list[str]:
    with opened_under(layout.records_root()) as seen:
        _cli(*args)
    return sorted({Path(p).parent.name for p in seen if p.endswith(RECORD_FILE)})


def test_status_and_runs_ls_open_one_record_of_many(tmp_path: Path) -> None:
    """1 record or 150 of the run (and 60 of others): `status NAME` and bare `status` open
    the newest record only, `runs ls` none; what they list is what every record says."""
    local_run("demo", str(tmp_path / "b"), 2, launches_of(10))
    newest = load_current("demo")
    alone = [_records_opened("status", "demo", "--json"), _records_opened("status", "--json")]
    assert alone == [[newest.run_id]] * 2
    _older(newest, 150)
    for i in range(3):
        _older(newest, 20, name=f"other{i}")
    assert _records_opened("status", "demo", "--json") == [newest.run_id]
    assert _records_opened("status", "--json") == [newest.run_id]
    assert _records_opened("runs", "ls") == []
    assert _records_opened("runs", "ls", "--json") == []
    listed = json.loads(_cli("runs", "ls", "--json").output)
    assert [r["run_id"] for r in listed] == [r.run_id for r in list_records()]
    assert listed[-1]["run_id"] == newest.run_id and len(listed) == 211
    assert find_record(newest.run_id) == newest == find_record("demo")


def test_runs_ls_shows_the_newest_fifty_unless_told(tmp_path: Path) -> None:
    local_run("demo", str(tmp_path / "b"), 1, launches_of(3))
    _older(load_current("demo"), 59)
    table = _cli("runs", "ls").output
    assert "the newest 50 of 60 records; --limit 0 lists all" in table
    assert table.count("demo-2023") == 50
    assert _cli("runs", "ls", "--limit", "0").output.count("demo-2023") == 60
    assert len(json.loads(_cli("runs", "ls", "--json", "--limit", "5").output)) == 5


def test_a_torn_stale_or_lost_index_never_lists_wrong(tmp_path: Path) -> None:
    """Whatever befell the index, `runs ls` lists what reading every record lists: a torn
    index is rebuilt; a record rewritten by another writer (an older mncloud) shows its new
    last event; a copied folder shows, a removed one is gone, an unreadable one left out."""
    local_run("demo", str(tmp_path / "b"), 1, launches_of(3))
    first = load_current("demo")
    ids = _older(first, 5)

    def listing() -> list[tuple[str, str | None]]:
        rows = json.loads(_cli("runs", "ls", "--json").output)
        assert [r["run_id"] for r in rows] == [r.run_id for r in list_records()]
        return [(r["run_id"], r["last_event"]) for r in rows]

    layout.records_index().write_text('{"v": 1, "entries": {"de')
    assert len(listing()) == 6
    assert json.loads(layout.records_index().read_text())["v"] == 1  # rebuilt

    behind = first.model_copy(update={"events": [*first.events, Event(kind="export", time=1.0)]})
    path = layout.record_dir(first.run_id) / RECORD_FILE
    write_atomic(path, behind.model_dump_json(indent=2))  # not through the store: no index
    assert (first.run_id, "export") in listing()

    copy = ids[0].replace("000000", "999999")
    shutil.copytree(layout.record_dir(ids[0]), layout.record_dir(copy))
    data = json.loads((layout.record_dir(copy) / RECORD_FILE).read_text())
    write_atomic(layout.record_dir(copy) / RECORD_FILE, json.dumps(data | {"run_id": copy}))
    shutil.rmtree(layout.record_dir(ids[1]))
    (layout.record_dir(ids[2]) / RECORD_FILE).write_text("{torn")
    shown = [run_id for run_id, _ in listing()]
    assert copy in shown and ids[1] not in shown and ids[2] not in shown
    layout.records_index().unlink()
    assert [run_id for run_id, _ in listing()] == shown
    summaries, total = list_summaries(limit=2)
    assert total == len(shown) and [s.run_id for s in summaries] == shown[-2:]
    assert load_current("demo").run_id == first.run_id
