"""The decision loop: each tick, measure progress, learn spot capacity, ask the policy, obey.

One tick is `ControlConfig.gap_s` of run time. An example, 2 nodes, work 1 h, deadline 1.6 h,
restart overhead 10 min, a trace whose spot capacity goes at 0.5 h and never comes back:

    tick 0   spot there → policy SPOT → `launch` spot (run record 1, event `launch`, spot $/h)
    tick 6   trace below 2 nodes → node 1 SIGKILLed, `down` (record 1: `preemption`); policy
             sees mode NONE and waits while the slack covers one restart and the work left
    tick 9   slack = one restart → policy ON_DEMAND → `launch` on-demand with
             Existing.RESUME: the same spec, the other market, from the newest complete
             checkpoint (run record 2, event `launch` with the reason, on-demand $/h)
    tick 17  the backend says SUCCEEDED → finished; the ledger of records 1 and 2 splits
             spot and on-demand

Progress is the newest complete checkpoint step × the measured seconds per step (the ranks'
telemetry of the newest launch that has one), in run time. Until the run has measured a step
time, the replay model's count of productive ticks stands in. `--hours` stays the work total;
while the run has not finished, progress is held one tick short of it, so a low estimate never
makes the policy stop a run that still trains.

`--budget` is checked before each tick: when the cost so far plus one more tick in the chosen
market, plus the stop's own notice, would cross it, the run is stopped and the state says so.
Every stop the controller makes (the budget, `mncloud down`, a switch of market) is graceful:
the nodes first get a preemption notice (`stop_notice_s`), so every rank saves the step it
reached through the emergency checkpoint path before the launch goes; checkpoints are never
deleted. A spot launch whose capacity the trace takes away is preempted as a cloud would (no
notice). Each decision is saved (`state.py`); SIGTERM (`mncloud down`) stops the run and the loop.

A launch that ends without the controller (finished, failed, cancelled by someone else) is
answered in `outcomes.py`: no capacity is the policy's next choice, an error in the user's code
is retried `--max-restarts` times over the whole run, SkyPilot's own failure is launched again.

Crash safety: an action on the run is journaled in the state before it starts (`closing`,
`launching` with the run id its record will have) and cleared once done; the launch made
(`live`: run id, SkyPilot job ids) is part of the state, mirrored to the bucket. A controller
started on a state with one set finishes it first (`recovery.py`), on any machine
(`identity.py`): a launch it finds already made is adopted, with its `launch` event written
once; one cut short is cleaned up and made again. So a restart never launches a decision twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mncloud.backends.base import RunState
from mncloud.control.handoff import hand, own_key, steers, wait_turn
from mncloud.control.horizon import blind, token_ends, token_stop
from mncloud.control.markets import Clock, Market, SystemClock
from mncloud.control.pacing import pause_s
from mncloud.control.progress import checkpoint_step, seconds_per_step
from mncloud.control.state import ControlState, Decision, Launching, save_state, stop_requested
from mncloud.control.steering import Course, LaunchMade, OnePlace
from mncloud.deadline.policy import (
    PAST_DEADLINE,
    Mode,
    Observation,
    Slack,
    decision_reason,
    make_policy,
    past_deadline,
)
from mncloud.errors import MncloudError

if TYPE_CHECKING:
    from mncloud.backends.base import Backend, RunStatus
    from mncloud.launch import Launched

log = logging.getLogger(__name__)

#: A spot launch's supervisor waits this long before relaunching by itself: never, in effect
#: (the controller decides when spot runs again).
SPOT_RECOVERY_HOLD_S = 86400.0
#: The preemption notice (wall seconds) the controller's own stops give the nodes: at most
#: this, one tick of wall time when that is shorter, but never under `MIN_NOTICE_S`.
STOP_NOTICE_S = 30.0
MIN_NOTICE_S = 5.0
#: `mncloud down`'s notice when its stop request says none.
DOWN_NOTICE_S = 30.0


class Controller:
    """Steers one deadline run (see the module docstring); `run` loops until it ends."""

    def __init__(
        self,
        state: ControlState,
        market: Market | None = None,
        *,
        course: Course | None = None,
        clock: Clock | None = None,
        backend: Backend | None = None,
        launcher: Callable[..., Launched] | None = None,
    ) -> None:
        """Steer in one place, capacity from `market`, or along `course` (`places.py`)."""
        from mncloud.backends.registry import get_backend
        from mncloud.launch import launch

        self.state = state
        self.clock = clock or SystemClock()
        self.backend = backend or get_backend(state.config.backend)
        self.launcher = launcher or launch
        self.job = state.config.job()
        if course is None:
            assert market is not None, "a market or a course"
            course = OnePlace(market, make_policy(state.config.policy, self.job))
        self.course = course
        self.stop_reason: str | None = None
        self.unsure = 0
        """Looks in a row that ended in an error (`unsure.py`)."""
        self.token_ends = token_ends(self.backend)
        """When this controller's API token expires: it hands off or stops before (`horizon.py`)."""
        self.handoff_key, self.succeeded = own_key(), False  # `handoff.py`

    # ------------------------------------------------------------------ loop
    def run(self) -> ControlState:
        """Decide every tick until the run finishes, fails, is stopped or hits the budget; an
        error in a look is "unsure, look again" with backoff, bounded (`unsure.py`)."""
        from mncloud.control.recovery import LaunchUnknown
        from mncloud.control.unsure import backoff_s, on_tick_error

        st = self.state
        if st.started_at is None:
            st.started_at = self.clock.time()
        if blind(self) or not wait_turn(self):  # past its token; not (yet) its run
            return st
        try:
            self._recover()
        except LaunchUnknown:
            raise  # not known whether to launch: exit non-zero, SkyPilot restarts the controller
        except MncloudError as err:
            on_tick_error(self, err)
        save_state(st)
        while not st.final and not self.succeeded:
            self.look()
            if not st.final and not self.succeeded:
                self.clock.sleep(max(pause_s(st, self.clock.time()), backoff_s(self.unsure)))
        return st

    def look(self) -> None:
        """One look of `run`: the journal first when an error cut the last look short, then
        a step (or the stop asked for); an error is unsure, or failed (`unsure.py`)."""
        from mncloud.control.unsure import on_tick_error

        st = self.state
        if blind(self) or not steers(self):  # past its token; not (yet) its run
            return
        hand(self)  # to a fresh controller job before the token expires
        if self.succeeded:
            return
        self.stop_reason = self.stop_reason or token_stop(self)  # before the token expires
        try:
            if st.launching is not None or st.closing is not None:
                self._recover()
            if self.stop_reason is not None:
                self._stop(self.stop_reason)
            else:
                self.step()
            self.unsure = 0
        except MncloudError as err:
            on_tick_error(self, err)
        save_state(st)

    def request_stop(self, reason: str = "stopped by mncloud down") -> None:
        """Stop at the next look (a signal handler calls this)."""
        self.stop_reason = reason

    def tick_at(self, now: float) -> int:
        from mncloud.control.pacing import run_seconds

        return int(run_seconds(self.state, now) // self.state.config.gap_s)

    def step(self) -> None:
        """One look: the end of the launch if it came (`outcomes.py`); a decision if a new
        tick began, or at once when a launch ended and the run goes on."""
        from mncloud.control.billing import follow, reopen
        from mncloud.control.outcomes import Settled, settle
        from mncloud.control.pacing import holds

        st, now = self.state, self.clock.time()
        status = self._live_status()
        followed = follow(self, status)  # the ledger bills what the queue says ran (`billing.py`)
        settled = settle(self, status)
        if settled in (Settled.ENDED, Settled.UNSURE):
            return
        tick = self.tick_at(now)
        if settled is Settled.AGAIN:
            status = None  # the launch is over: nothing runs
        elif tick <= st.last_tick:
            return
        if holds(st, now, status, self._work_ticks):
            return  # a paced rehearsal: the new tick waits for the training (`pacing.py`)
        spot_here, spot_now = self.course.learn(st, tick, status, now)
        from mncloud.control import elastic

        elastic.observe(self, tick, status, now)
        if st.mode is Mode.SPOT and (not spot_here or self._held_after_loss(status)):
            waited = status is not None and status.state in (RunState.PENDING, RunState.STARTING)
            self.preempted(tick, recorded=followed, ran=not waited)
        elif elastic.shrinks(self) or elastic.grows(self):
            elastic.resize(self, tick)  # the decision below launches on the nodes offered
        elif st.mode is Mode.NONE and st.market is Mode.SPOT and spot_here:
            st.mode, st.entered_tick = Mode.SPOT, tick  # the queued spot job got its VMs
            if not followed:
                reopen(self)  # its ledger segment opens again (`billing.py`)
        # Only a cluster the backend reports RUNNING does work: a managed job still PENDING
        # for VMs (SkyPilot looks for capacity for a while) makes no progress.
        running = status is not None and status.state is RunState.RUNNING
        self._decide(tick, spot_now, now, running=running)

    def _decide(self, tick: int, spot_now: bool, now: float, *, running: bool) -> None:
        st, job = self.state, self.job
        work = self._work_ticks()
        overhead_left = max(0, job.overhead_ticks - (tick - st.entered_tick))
        if st.mode is Mode.NONE:
            overhead_left = 0
        obs = Observation(tick, work, st.mode, overhead_left, spot_now, list(st.history))
        slack = Slack.of(job, obs)
        if past_deadline(job, tick):
            choice, reason = Mode.ON_DEMAND, PAST_DEADLINE
        else:
            choice = self.course.choose(st, obs)
            reason = decision_reason(choice, obs, slack, job.gap_seconds)
        st.work_hours, st.hours_left = work * job.gap_seconds / 3600, slack.time_left * job.hours(1)
        st.slack_hours = slack.slack * job.hours(1)
        self.refresh_costs()
        budget = st.config.budget
        spent = st.cost + st.spent_before
        tick_cost = self.course.price(st, choice, self.course.place_of(st, choice)) * job.hours(1)
        if budget is not None and spent + tick_cost + self._stop_cost() > budget:
            self._stop(
                f"budget ${budget:,.2f}: ${spent:,.2f} spent and the next "
                f"{job.hours(1) * 60:g} min {choice.value} would cross it",
                budget_left=budget - spent,
            )
            return
        decision = Decision(
            time=now, tick=tick, spot_now=spot_now, chose=choice,
            work_hours=st.work_hours, slack_hours=st.slack_hours, reason=reason,
        )  # fmt: skip
        self._apply(choice, tick, reason, decision)
        if st.mode is not Mode.NONE and overhead_left == 0 and running:
            st.model_work_ticks += 1
        self.decided(decision)

    def decided(self, decision: Decision) -> None:
        st = self.state
        st.last_tick = max(st.last_tick, decision.tick)
        log.info("tick %d: %s (%s); work %.2f h, slack %.2f h", decision.tick,
                 decision.chose.value, decision.reason, st.work_hours, st.slack_hours)  # fmt: skip
        st.note(decision)

    # --------------------------------------------------------------- actions
    def _apply(self, choice: Mode, tick: int, reason: str, decision: Decision) -> None:
        st = self.state
        where = self.course.place_of(st, choice)
        decision.place = self.course.place_name(where)
        if choice is Mode.SPOT and st.market is Mode.SPOT and where not in (None, st.place):
            self._journal(choice, tick, reason, decision, where)  # a move to spot elsewhere
            self.take_down(f"moving to spot in {decision.place}: {reason}")
            self.launch(choice, tick, reason)
            return
        if choice is st.mode:
            return
        if choice is Mode.NONE:
            if st.market is not Mode.NONE and not (st.market is Mode.SPOT and st.mode is Mode.NONE):
                self.take_down(f"waiting: {reason}")
            st.mode, st.phase = Mode.NONE, "waiting"
            return
        if choice is Mode.SPOT and st.market is Mode.SPOT:
            st.mode, st.entered_tick, st.phase = Mode.SPOT, tick, "spot"
            return
        self._journal(choice, tick, reason, decision, where)
        if st.market is not Mode.NONE:
            self.take_down(f"switching to {choice.value}: {reason}")
        self.launch(choice, tick, reason)

    def _journal(
        self, mode: Mode, tick: int, reason: str, decision: Decision, place: int | None
    ) -> None:
        """Journal a launch before it starts, with the run id its record will have: a
        controller that dies from here on finishes it, once (`recovery.py`)."""
        from mncloud.records.store import new_run_id

        st = self.state
        st.launching = Launching(mode=mode, tick=tick, reason=reason, at=self.clock.time(),
                                 decision=decision, place=place,
                                 run_id=new_run_id(st.name))  # fmt: skip
        try:
            save_state(st, journal=True)  # in the bucket before the launch is sent
        except MncloudError:
            st.launching = None  # never sent: nothing for a restart to finish
            raise

    def launch(self, mode: Mode, tick: int, reason: str, *, again: bool = False) -> None:
        """Launch the spec in `mode` (`again`: after a launch cut short by a crash)."""
        from mncloud.control.pacing import off_the_clock
        from mncloud.launch import Existing
        from mncloud.spec import JobSpec, Recovery, SpotPolicy
        from mncloud.spec.launch import LaunchOptions

        st, cfg = self.state, self.state.config
        from mncloud.control.elastic import launch_nodes

        spec = JobSpec.model_validate(st.spec)
        market = SpotPolicy.SPOT if mode is Mode.SPOT else SpotPolicy.ON_DEMAND
        st.nodes_live = nodes = launch_nodes(self, mode)
        if nodes < cfg.nodes:
            reason = f"{reason}; elastic: on the {nodes} of {cfg.nodes} nodes spot offers"
        # The controller owns the error budget (`outcomes.py`): a launch retries nothing itself.
        spec = spec.updated(spot=market, max_restarts=0, nodes=nodes)
        update: dict[str, Any] = {}
        if self.backend.runs_here:
            # The ledger bills wall time; a rehearsal's $/h is per hour of run time.
            update["hourly_price"] = self.course.price(st, mode) * cfg.time_scale
            if mode is Mode.SPOT and spec.recovery is not Recovery.NODE:
                # The gang waits for the controller; under node recovery a lost node is
                # replaced after the modeled provisioning while the others train on.
                update["recovery_delay"] = SPOT_RECOVERY_HOLD_S
        options = LaunchOptions.model_validate(st.options).model_copy(update=update)
        first = not st.run_ids and not again
        existing = Existing(st.existing) if first else Existing.RESUME
        spec = self.course.pinned(st, spec, self.backend.runs_here)
        run_id = st.launching.run_id if st.launching is not None else None
        with off_the_clock(st, self.clock):  # a paced rehearsal's launch takes no run time
            launched = self.launcher(
                spec, options, existing=existing, approve=lambda _plan: True, notify=log.info,
                record_events=False,  # the controller records its own launches and ends
                **({"run_id": run_id} if run_id else {}),
            )  # fmt: skip
        plan = launched.prepared.plan
        choice = plan.choice if plan is not None else None
        placement = {
            "hourly_price": choice.hourly_total if choice is not None else None,
            "cloud": choice.cloud if choice else launched.status.cloud,
            "region": choice.region if choice else launched.status.region,
            "instance_type": choice.instance_type if choice else launched.status.instance_type,
        }
        ckpt_uri = launched.status.ckpt_uri
        self.launched(LaunchMade(mode, tick, reason, launched.run_id, ckpt_uri, placement))

    def launched(self, made: LaunchMade) -> None:
        """Record a launch made (or found made, after a crash): once."""
        made = self.course.placed(self.state, made, self.backend.runs_here)
        mode, tick, reason = made.mode, made.tick, made.reason
        run_id, ckpt_uri, placement = made.run_id, made.ckpt_uri, made.placement
        st, cfg = self.state, self.state.config
        if run_id and run_id not in st.run_ids:
            st.run_ids.append(run_id)
        st.ckpt_uri = ckpt_uri or st.ckpt_uri
        switched = st.last_launch is not None and st.last_launch is not mode
        st.switches += switched
        if placement.get("hourly_price") is None:
            placement["hourly_price"] = self.course.price(st, mode) * cfg.time_scale
        from mncloud.control.recovery import has_launch_event

        if not has_launch_event(run_id):
            self.event(
                "launch",
                f"deadline controller: {'switch to ' if switched else ''}{mode.value}: {reason}",
                spot=mode is Mode.SPOT,
                **placement,
            )
        from mncloud.control.identity import remember

        remember(st, run_id, mode)
        st.market = st.mode = st.last_launch = mode
        st.entered_tick, st.entered_at = tick, self.clock.time()
        st.phase = mode.value
        st.launching = None
        save_state(st)

    def take_down(self, why: str, notice_s: float | None = None) -> None:
        """Stop the live launch (checkpoints stay), after a preemption notice; a cloud launch
        gets its closing event."""
        from mncloud.control.billing import close
        from mncloud.control.pacing import off_the_clock

        st = self.state
        st.closing = why
        save_state(st)
        with off_the_clock(st, self.clock):  # paced: the notice and teardown take no run time
            self.down(self.stop_notice_s() if notice_s is None else notice_s)
        close(self, "finish", f"deadline controller: {why}")  # unless SkyPilot's end did
        st.market, st.closing = Mode.NONE, None
        save_state(st)

    def down(self, notice_s: float) -> None:
        """`down` the run after a preemption notice of `notice_s` wall seconds (a cloud run's
        through its bucket: see `backends/skypilot/notice.py`)."""
        self.backend.down(self.state.name, notice_s=notice_s, by="the deadline controller")

    def stop_notice_s(self, budget_left: float | None = None) -> float:
        """The notice a controller's stop gives (see the constants); with `budget_left`, no
        longer than the budget pays for in the live market."""
        cfg = self.state.config
        notice = min(STOP_NOTICE_S, max(MIN_NOTICE_S, cfg.gap_s / cfg.time_scale))
        hourly = self._hourly() * cfg.time_scale  # per wall h
        if budget_left is not None and hourly > 0:
            notice = min(notice, max(0.0, budget_left) / hourly * 3600)
        return notice

    def _stop_cost(self) -> float:
        """What a stop's notice costs in the live market (kept inside the budget)."""
        return self._hourly() * self.state.config.time_scale * self.stop_notice_s() / 3600

    def _hourly(self) -> float:
        """USD per hour (run time) in the live market, where it runs."""
        return self.course.price(self.state, self.state.market, self.state.place)

    def _held_after_loss(self, status: RunStatus | None) -> bool:
        """A local spot launch that lost a node the trace did not take (a kill, a crash of the
        host): its supervisor holds it for the controller (`SPOT_RECOVERY_HOLD_S`), so it is
        lost like a preemption and the policy launches again from the newest checkpoint."""
        return (
            self.backend.runs_here
            and self.state.spec.get("recovery") != "node"  # its supervisor replaces the node
            and status is not None
            and status.state is RunState.RECOVERING
        )

    def preempted(self, tick: int, *, recorded: bool = False, ran: bool = True) -> None:
        """Spot is gone for the live launch; `recorded`: its ledger follows the queue, which
        said whether (and when) VMs it had were preempted (`billing.py`); `ran`: it had
        started (a job that waited for capacity and never ran was preempted from nothing:
        its record says `waiting`, and `plan --learn` learns no preemption from it)."""
        from mncloud.control.pacing import off_the_clock

        st = self.state
        st.preemptions += 1
        if not self.course.keeps_spot_request:
            st.closing = "spot capacity for the nodes is gone"
            save_state(st)
        with off_the_clock(st, self.clock):  # paced: the teardown takes no run time
            self.course.lose_spot(st.name, self.backend)
        if not self.backend.records_own_events and not recorded:
            self.event(
                "preemption" if ran else "waiting",
                "deadline controller: spot capacity for the nodes is gone",
            )
        if not self.course.keeps_spot_request:
            st.market, st.closing = Mode.NONE, None
        st.mode, st.phase = Mode.NONE, "waiting"

    def _stop(self, why: str, *, budget_left: float | None = None) -> None:
        st = self.state
        if st.market is not Mode.NONE:
            if budget_left is not None:
                notice = self.stop_notice_s(budget_left)
            else:  # `mncloud down`: the notice it asked for
                notice = float((stop_requested(st.name) or {}).get("notice_s", DOWN_NOTICE_S))
            self.take_down(why, notice)
        step = checkpoint_step(st)
        kept = f"; newest complete checkpoint step {step} kept" if step is not None else ""
        st.phase, st.mode, st.detail = "stopped", Mode.NONE, f"{why}{kept}"
        self.refresh_costs()

    # -------------------------------------------------------------- recovery
    def _recover(self) -> None:
        """Finish what a controller that died left half done (`recovery.py`)."""
        from mncloud.control.recovery import recover

        recover(self)

    def event(self, kind: Any, detail: str, **placement: Any) -> None:
        from mncloud.records.store import append_event

        append_event(self.state.name, kind, detail=detail, at=self.clock.time(), **placement)

    # -------------------------------------------------------------- watching
    def _live_status(self) -> RunStatus | None:
        if self.state.market is Mode.NONE:
            return None
        try:
            return self.backend.status(self.state.name)
        except MncloudError as err:
            log.warning("status of %s unknown this tick: %s", self.state.name, err)
            return None

    def _work_ticks(self) -> int:
        """Ticks of work done: measured when the run has a step time, else the model's count."""
        st, job = self.state, self.job
        rate = seconds_per_step(st)
        if rate is None:
            work = st.model_work_ticks
        else:
            step = checkpoint_step(st) or 0
            if st.config.pace_step_s is None:
                # A smaller world's steps are slower (`elastic.py`): work at the gang's speed.
                rate *= (st.nodes_live or job.nodes) / job.nodes
            work = int(step * rate * st.config.time_scale // job.gap_seconds)
        return max(0, min(work, job.work_ticks - 1))

    def refresh_costs(self) -> None:
        """Spot and on-demand cost so far: the ledgers of every launch's run record."""
        from mncloud.control.billing import refresh_costs

        refresh_costs(self.state, self.course, self.clock.time())
