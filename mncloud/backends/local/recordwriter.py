"""The supervisor's run-record writer: events go to `records/` from one thread of their own."""

from __future__ import annotations

import queue
import threading
from typing import Any

from mncloud.backends.local.nodes import RunLogs


class RecordWriter:
    """Run-record events, written by one thread from a queue: a bucket write can stall for
    seconds during a storage outage, and supervision must never wait for it."""

    def __init__(
        self, name: str, procs_per_node: int, log: RunLogs, spot: bool = False, price: float = 0.0
    ) -> None:
        self.name, self.procs_per_node, self.log = name, procs_per_node, log
        self.spot, self.price = spot, price
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._write, name="mncloud-records", daemon=True)
        self._thread.start()

    def put(
        self, kind: str, message: str, node: int | None, at: float, price: float | None = None
    ) -> None:
        self._queue.put({"kind": kind, "node": node, "detail": message, "at": at,
                         "price": self.price if price is None else price})  # fmt: skip

    def _write(self) -> None:
        from mncloud.records.store import append_event

        while (item := self._queue.get()) is not None:
            try:
                append_event(
                    self.name, item["kind"], node=item["node"], cloud="local",
                    instance_type=f"cpu:{self.procs_per_node}", spot=self.spot,
                    hourly_price=item["price"], detail=item["detail"], at=item["at"],
                )  # fmt: skip
            except Exception as err:  # a record must never break supervision
                self.log.write(f"[mncloud] run record event not written: {err}")

    def flush(self, timeout: float = 60.0) -> None:
        """Let the writer finish what is queued (bounded: a bucket may be down)."""
        self._queue.put(None)
        self._thread.join(timeout)
