"""What a training script reports besides its checkpoints, in one small object.

    progress = Progress(ckpt, replicas, rank=d.rank)
    progress.event(event="start", resumed_from=start, world_size=d.world_size)
    progress.event(step=step, loss=loss)           # once a step
    progress.finish(steps=step, final_loss=loss)   # at the end: `final.json` and a `done` event

Every rank's step events go to the run's telemetry segments (`mncloud.train.report`); rank 0
(of each node, under node recovery, tagged with its number) records the other events there too
(`mncloud.train.steptime.event`): the steps lost and the time to resume that `mncloud up`
prints are read from them, on every backend. `finish` writes the result as
`final.json` beside the checkpoints (one writer: rank 0 of the replica that saves), where a
test or a pipeline reads it. Without torchrun or mncloud it costs nothing.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from mncloud.storage import join_key, open_bucket
from mncloud.storage.final import FINAL_FILE
from mncloud.train.steptime import event, report

if TYPE_CHECKING:
    from mncloud.train.ckpt import CheckpointManager
    from mncloud.train.ft import Replicas


class Progress:
    """Steps and events into the run's telemetry; the final result beside the checkpoints."""

    def __init__(
        self, ckpt: CheckpointManager, replicas: Replicas | None = None, *, rank: int
    ) -> None:
        """`replicas`: the script's node recovery (None: a gang-recovered script)."""
        self._ckpt, self._replicas, self._main = ckpt, replicas, rank == 0
        on = replicas is not None and replicas.enabled
        self._node = {"node": replicas.replica} if on and replicas is not None else {}

    def event(self, **record: Any) -> None:
        """Record a step (`step=…`, no `event`) on every rank, or an event (`event="start"`,
        …) on rank 0, in the run's telemetry segments.

        A step goes through `mncloud.train.report`: its `ckpt_s` and each other finite scalar
        (`loss=…`) as metrics, for the goodput ledger, `mncloud metrics` and the web view."""
        if "event" not in record:
            if "step" in record:
                fields = {k: v for k, v in record.items() if k not in ("step", "ckpt_s")}
                with contextlib.suppress(TypeError, ValueError):  # telemetry never stops training
                    report(int(record["step"]), ckpt_s=record.get("ckpt_s"), **fields)
            return
        if self._main:
            fields = {k: v for k, v in record.items() if k != "event"}
            event(str(record["event"]), **{**self._node, **fields})

    def finish(self, **result: Any) -> None:
        """Write `final.json` beside the checkpoints (once per run) and a `done` event."""
        if not self._main:
            return
        # Under node recovery: the one replica that saves.
        if self._replicas is None or self._replicas.saves:
            bucket, prefix = open_bucket(self._ckpt.uri)
            bucket.put_bytes(join_key(prefix, FINAL_FILE), json.dumps(result).encode())
        self.event(event="done", **result)
