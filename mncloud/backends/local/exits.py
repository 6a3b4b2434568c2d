"""What the end of an attempt means, from its nodes' exit codes, and what the supervisor does
next: SkyPilot's managed-job recovery, one decision per outcome.

    outcome    the nodes                               next
    preempted  one vanished (a signal), exited 115, or  relaunch after --recovery-delay; counted
               `chaos` asked for it                     in `preemptions`, not in --max-restarts
    outage     every node that failed exited 75: its    relaunch after a backoff (below);
               bucket did not answer (the preflight's   counted in `outages`, not in
               bucket check, `STORAGE_OUTAGE_EXIT_CODE`) --max-restarts
    refused    its script refused its input (116)       the run fails: nothing mends it
    error      any other non-zero exit                  retried --max-restarts times, then failed

On a cloud the same exit codes reach SkyPilot: 115 and 75 are the task's
`recover_on_exit_codes` (recovered however often, never counted against
`max_restarts_on_errors`), any other is counted. The outage's backoff is the local side's own:
a storage outage lasts as long as it lasts, and each relaunch into it costs a start-up. With
`--recovery-delay 2s`, a 30 s outage that catches a relaunch:

    t=0     preempted: relaunch in 2s (preemption 1)
    t=5     both nodes exit 75 (their preflight found the bucket down): relaunch in 2s
            (storage outage 1)
    t=12    75 again: relaunch in 4s (storage outage 2); then 8s, 16s, … up to 2 min
    t=35    the bucket answers: the nodes resume from the newest complete checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tenacity import RetryCallState, wait_exponential

from mncloud import constants
from mncloud.backends.local.processes import describe_exit
from mncloud.backends.local.state import LocalLaunch, LocalState

Outcome = Literal["succeeded", "preempted", "outage", "refused", "error", "stopped"]

OUTAGE_BACKOFF = wait_exponential(multiplier=2.0, min=2.0, max=120.0)
"""Seconds before the relaunch after the n-th storage outage in a row (2, 4, 8, … 120)."""


@dataclass(frozen=True)
class Ending:
    """How an attempt ended: its outcome (refused is told apart later, by the node's marker),
    the node named for it, one line, and the nodes lost with their VMs."""

    outcome: Outcome
    node: int
    message: str
    lost: set[int]


def ending(codes: dict[int, int | None], requested: set[int]) -> Ending:
    """The end of an attempt in which a node failed: `codes` by node (None: still running),
    `requested` the nodes `chaos` preempted during it."""
    failed = {n: c for n, c in codes.items() if c not in (None, 0)}
    vanished = {n for n, c in failed.items() if c < 0 or c == constants.PREEMPTED_EXIT_CODE}
    preempted = bool(vanished or requested)
    first = min(vanished or requested or set(failed))
    code = failed.get(first, codes.get(first))
    what = describe_exit(code) if code is not None else "was preempted"
    message = f"node {first} {what}" + (" (preempted)" if preempted else "")
    lost = {n for n in vanished | requested if n in codes}
    if preempted:
        return Ending("preempted", first, message, lost)
    if all(c == constants.STORAGE_OUTAGE_EXIT_CODE for c in failed.values()):
        return Ending("outage", first, message, lost)
    return Ending("error", first, message, lost)


def outage_delay_s(in_a_row: int, recovery_delay: float) -> float:
    """The wait before relaunching after the `in_a_row`-th storage outage in a row: the
    backoff, and never less than --recovery-delay."""
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(1, in_a_row)
    return max(recovery_delay, float(OUTAGE_BACKOFF(state)))


def next_launch(
    st: LocalState, la: LocalLaunch, outcome: Outcome, message: str, outages_in_a_row: int
) -> tuple[float, str] | None:
    """After an attempt that ended by `outcome` (not success, not a stop): the seconds to wait
    and why, the state's counters updated; None when the run ends failed (`st.detail` says
    why)."""
    if outcome == "refused":  # the same input is refused again: no retry mends it
        st.detail, st.refused = f"failed: {message} (refused: not retried)", True
        return None
    delay = la.recovery_delay
    if outcome == "preempted":  # always recovered; never spends the error budget
        st.preemptions += 1
        why = f"preemption {st.preemptions}"
    elif outcome == "outage":  # neither: the storage, not the code, and it comes back
        st.outages += 1
        delay = outage_delay_s(outages_in_a_row, la.recovery_delay)
        why = f"storage outage {st.outages}: backoff, not counted against --max-restarts"
    elif st.errors_retried >= la.max_restarts:
        st.detail = (
            f"failed: {message} (an error in your code; retried {st.errors_retried} "
            f"of --max-restarts {la.max_restarts} times)"
        )
        return None
    else:
        st.errors_retried += 1
        why = f"error retry {st.errors_retried}/{la.max_restarts}"
    st.restarts += 1
    return delay, why


def end_tail(st: LocalState) -> str:
    """The counts a run's last line ends with: "2 restarts, 1 preemption" (and its storage
    outages, when there were any)."""
    tail = f"{plural(st.restarts, 'restart')}, {plural(st.preemptions, 'preemption')}"
    return tail + (f", {plural(st.outages, 'storage outage')}" if st.outages else "")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
