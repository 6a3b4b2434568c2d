"""The supervisor's run-record writer: which of its events become run-record events (and at
what price), written to `records/` from one thread of their own."""

from __future__ import annotations

import queue
import threading
from typing import Any

from mncloud.backends.local.nodes import RunLogs
from mncloud.backends.local.state import Event
from mncloud.records.model import RunRecord

# Supervisor event kinds → run-record event kinds (records/); "launch" is mapped by attempt.
_RECORD_KINDS = {"preempted": "preemption", "error": "failure", "outage": "failure",
                 "succeeded": "finish",
                 "failed": "failure", "cancelled": "finish", "node-lost": "node-lost",
                 "node-joined": "node-joined", "node-healed": "node-healed"}  # fmt: skip
#: The run-record events that end an attempt: mncloud's figures then go to its tracker run.
ATTEMPT_ENDS = ("preemption", "failure", "finish")


class RecordWriter:
    """Run-record events, written by one thread from a queue: a bucket write can stall for
    seconds during a storage outage, and supervision must never wait for it."""

    def __init__(
        self, name: str, procs_per_node: int, log: RunLogs, spot: bool = False, price: float = 0.0,
        ckpt_uri: str | None = None,
    ) -> None:  # fmt: skip
        self.name, self.procs_per_node, self.log = name, procs_per_node, log
        self.ckpt_uri = ckpt_uri  # where the ranks' telemetry is (the goodput figure)
        self.spot, self.price = spot, price
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._write, name="mncloud-records", daemon=True)
        self._thread.start()

    def supervisor_event(
        self, kind: str, message: str, node: int | None, at: float, attempt: int,
        events: list[Event], billed_nodes: int, nodes: int,
    ) -> None:  # fmt: skip
        """Queue the run-record event for a supervisor event of `kind`, if it maps to one.
        `events`: the supervisor's, this one last (a launch after a preemption is a recovery,
        after an error or a storage outage a restart); `billed_nodes` of the run's `nodes`
        are billed now (every node not being provisioned): a node's loss or join is priced so."""
        mapped = _RECORD_KINDS.get(kind)
        if kind == "launch":
            prev = [e.kind for e in events[:-1] if e.kind in ("preempted", "error", "outage")]
            mapped = "launch" if attempt == 1 else (
                "recovery" if prev and prev[-1] == "preempted" else "restart")  # fmt: skip
        price = None
        if mapped in ("node-lost", "node-joined"):
            price = self.price * billed_nodes / max(1, nodes)
        if mapped:
            self.put(mapped, message, node, at, price)

    def put(
        self, kind: str, message: str, node: int | None, at: float, price: float | None = None
    ) -> None:
        self._queue.put({"kind": kind, "node": node, "detail": message, "at": at,
                         "price": self.price if price is None else price})  # fmt: skip

    def _write(self) -> None:
        from mncloud.records.store import append_event

        while (item := self._queue.get()) is not None:
            try:
                record = append_event(
                    self.name, item["kind"], node=item["node"], cloud="local",
                    instance_type=f"cpu:{self.procs_per_node}", spot=self.spot,
                    hourly_price=item["price"], detail=item["detail"], at=item["at"],
                )  # fmt: skip
            except Exception as err:  # a record must never break supervision
                self.log.write(f"[mncloud] run record event not written: {err}")
                continue
            if record is not None and item["kind"] in ATTEMPT_ENDS:
                self._tell_trackers(record)

    def _tell_trackers(self, record: RunRecord) -> None:
        """An attempt ended: mncloud's figures to the run's tracker run (`records.trackers`)."""
        from mncloud.records.trackers import post_figures

        for warning in post_figures(record, self.ckpt_uri):
            self.log.write(f"[mncloud] {warning}")

    def flush(self, timeout: float = 60.0) -> None:
        """Let the writer finish what is queued (bounded: a bucket may be down)."""
        self._queue.put(None)
        self._thread.join(timeout)
