"""Elastic spot runs (`--min-nodes`): train on the spot nodes there are, grow back later.

A spot launch runs on min(`--nodes`, the nodes spot offers) nodes, as long as that is at least
`--min-nodes`; an on-demand launch always on `--nodes`. Every size change is a relaunch from the
newest complete checkpoint, the launch before it gone first (never two live launches of a
run): the checkpoint reshards on load (DCP), the sampler's cursor is global, and the script
keeps the global batch through `mncloud.train.accumulation_steps`. An example, `--nodes 4
--min-nodes 2`, a local trace offering 4 4 2 2 2 4 4 … nodes:

    tick 0  4 offered → a spot launch on 4 nodes
    tick 2  2 offered → the trace takes a node (a preemption, no notice, as a cloud's); its
            replacement is not coming, so the policy's spot launch, this same tick, is on 2
    tick 5  4 offered again → noted at the newest checkpoint step s; at the first complete
            checkpoint past s the 2-node launch is stopped (a notice: every rank saves the
            step it reached) and launched again on 4
Without `--min-nodes`, spot counts only when all `--nodes` are offered: the gang waits.

What is offered comes from the market (`Market.offered`): a local trace counts nodes; SkyPilot's
managed job does not, so there a spot job that waits `capacity_wait_s` for its VMs (or is
recovering) is cancelled and launched again one node smaller, down to `--min-nodes`, and one
that has run `probe_after_s` on fewer tries all `--nodes` again at its next checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mncloud.control.progress import checkpoint_step
from mncloud.deadline.policy import Mode

if TYPE_CHECKING:
    from mncloud.backends.base import RunStatus
    from mncloud.control.steering import Steering


def observe(ctl: Steering, tick: int, status: RunStatus | None, now: float) -> None:
    """Note the spot nodes on offer now (`ControlState.nodes_offered`), at most `--nodes`."""
    st = ctl.state
    if st.config.min_nodes is None:
        return
    count = ctl.course.offered(st, tick, status, now)
    st.nodes_offered = None if count is None else min(st.config.nodes, count)


def launch_nodes(ctl: Steering, mode: Mode) -> int:
    """How many nodes a launch in `mode` gets now."""
    cfg, offered = ctl.state.config, ctl.state.nodes_offered
    if mode is not Mode.SPOT or cfg.min_nodes is None or offered is None:
        return cfg.nodes
    return max(cfg.min_nodes, offered)


def shrinks(ctl: Steering) -> bool:
    """The live spot launch has more nodes than spot offers (but ≥ `--min-nodes`: else spot is
    simply missing): a preemption whose replacement is not coming."""
    st = ctl.state
    if not _elastic_spot(ctl) or st.nodes_offered is None or st.nodes_live is None:
        return False
    return (
        st.config.min_nodes is not None and st.config.min_nodes <= st.nodes_offered < st.nodes_live
    )


def grows(ctl: Steering) -> bool:
    """Spot offers more nodes than the live spot launch has, and a checkpoint completed since
    that was first seen: time to launch again on more nodes (see the module docstring)."""
    st = ctl.state
    if not _elastic_spot(ctl) or st.nodes_offered is None or st.nodes_live is None:
        return False
    if st.nodes_offered <= st.nodes_live:
        st.grow_after_step = None
        return False
    step = checkpoint_step(st)
    newest = -1 if step is None else step
    if st.grow_after_step is None:
        st.grow_after_step = newest
        return False
    return newest > st.grow_after_step


def resize(ctl: Steering, tick: int) -> None:
    """Stop the live spot launch so that the policy's spot launch, this same tick, runs on the
    nodes on offer: locally a shrink is the trace's preemption (no notice, as a cloud's); else
    a stop with a notice (every rank saves the step it reached), then `down` (`take_down`)."""
    st = ctl.state
    before, now = st.nodes_live, st.nodes_offered
    why = f"{'growing' if (now or 0) > (before or 0) else 'shrinking'} from {before} to {now} nodes"
    if (now or 0) < (before or 0) and not ctl.course.keeps_spot_request:
        ctl.preempted(tick)
    else:
        ctl.take_down(f"elastic: {why}: spot offers {now}")
    st.mode, st.phase, st.grow_after_step = Mode.NONE, "waiting", None


def _elastic_spot(ctl: Steering) -> bool:
    st = ctl.state
    return st.config.min_nodes is not None and st.mode is Mode.SPOT and st.market is Mode.SPOT
