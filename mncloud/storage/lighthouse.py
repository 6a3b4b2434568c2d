"""Where a cloud run's nodes find torchft's lighthouse: its address beside the checkpoints.

Under `--recovery node` on a cloud every node is a task of a SkyPilot job group, on a VM of
its own, and the lighthouse (the quorum server) is one more task. SkyPilot 0.14 gives the
tasks of a group names to reach each other by on Kubernetes only, so the lighthouse task
publishes its private address here (`LIGHTHOUSE.json`, refreshed every `REFRESH_S`), and each
node, at its start or its replacement's, reads it before training. An address of another
launch (a different run id) or one not refreshed for `STALE_S` is not used: a node waits for
the live lighthouse instead.

    t=0    lighthouse VM up: LIGHTHOUSE.json {url: http://10.0.3.7:29510, run_id, at: 0}
    t=40   node 2 (a replacement) starts: reads it, fresh → TORCHFT_LIGHTHOUSE, joins
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from mncloud.storage.checkpoints import CheckpointStore

LIGHTHOUSE_ADDRESS = "LIGHTHOUSE.json"
REFRESH_S = 30.0
"""How often the lighthouse task rewrites its address (its liveness)."""
STALE_S = 120.0
"""An address not rewritten for this long belongs to a lighthouse that is gone."""


class LighthouseAddress(BaseModel):
    """The lighthouse of one launch: its URL, the launch's run id, when last written."""

    url: str
    run_id: str | None
    at: float


def publish_address(store: CheckpointStore, url: str, run_id: str | None) -> LighthouseAddress:
    """Write (or refresh) the lighthouse's address."""
    address = LighthouseAddress(url=url, run_id=run_id, at=time.time())
    store.put_note(LIGHTHOUSE_ADDRESS, address)
    return address


def read_address(
    store: CheckpointStore, run_id: str | None, now: float | None = None
) -> LighthouseAddress | None:
    """The live lighthouse of launch `run_id`, if any (another launch's, a stale or an
    unreadable one counts as none)."""
    address = store.get_note(LIGHTHOUSE_ADDRESS, LighthouseAddress)
    if address is None:
        return None
    if run_id is not None and address.run_id != run_id:
        return None
    if address.at + STALE_S < (time.time() if now is None else now):
        return None
    return address
