"""The ledger bills what SkyPilot runs: a spot job SkyPilot recovered by itself bills again.

A cloud spot job that goes RECOVERING (or waits past `capacity_wait_s`) gets a `preemption`
event, which closes its cost segment: while SkyPilot looks for VMs nothing runs, nothing is
billed. SkyPilot keeps the spot request (`ManagedJobMarket.keeps_spot_request`) and, when it
gets VMs again, the same job runs on: its segment must open again, or 4 nodes train unbilled
and `--budget` is overrun. Sequence:

    t=0     launch (spot, $40/h)           segment 1 opens
    t=1 h   RECOVERING: `preemption`       segment 1 closes ($40)
    t=1.2h  RUNNING again: `recovery`      segment 2 opens at the same price
    t=1.7h  looked at                      $40 + $20 so far
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mncloud.errors import MncloudError

if TYPE_CHECKING:
    from mncloud.control.steering import Steering

PLACEMENT = ("cloud", "region", "instance_type", "spot", "hourly_price")


def reopen(ctl: Steering) -> None:
    """The live spot job got VMs again after the controller counted it preempted: its record
    gets a `recovery` event priced as its launch (see the module docstring)."""
    from mncloud.records.store import append_event, find_record

    st = ctl.state
    if ctl.backend.records_own_events or not st.run_ids:  # the backend records it (local)
        return
    try:
        events = find_record(st.run_ids[-1]).events
    except MncloudError:
        return
    launch = next((e for e in reversed(events) if e.kind == "launch"), None)
    if launch is None:
        return
    placement = {k: getattr(launch, k) for k in PLACEMENT}
    append_event(
        st.name,
        "recovery",
        detail="deadline controller: SkyPilot got the spot job VMs again",
        at=ctl.clock.time(),
        **placement,
    )
