"""Why a plan chose what it chose, in one line each: the choice, an excluded market, the other
recovery mode, and (with a workload) when speed, not the hourly price, decided."""

from __future__ import annotations

from mncloud.catalog import Exclusion
from mncloud.plan.costmodel import MAX_LOSS_FRACTION, gang_failure_probability
from mncloud.plan.model import Candidate, Minimize, Plan, PlanRequest
from mncloud.spec import Recovery, SpotPolicy, min_replicas


def unfinishable(group: list[Candidate], request: PlanRequest) -> str:
    """Why one cloud's offers in one market are left out: they would mostly recover."""
    c = min(group, key=lambda c: c.hourly_total)
    regions = len({b.region for b in group}) - 1
    where = f"{c.market} in {c.region}" + (f" (+{regions} regions)" if regions else "")
    node, hint = c.by_recovery.get(Recovery.NODE), "; use fewer nodes or on-demand"
    if request.recovery is Recovery.NODE:
        hint = ", even with node recovery" + hint
    elif node is not None and node.viable:
        hint += (  # the node model's loss, which is under the limit
            f", or --recovery node (it would lose {node.loss_fraction:.0%}; the script must "
            "use mncloud.train.Replicas)"
        )
    return (
        f"{where}: at {c.preemption_rate:.3g} preemptions per node-hour ({c.hazard_source}) × "
        f"{request.nodes} nodes the job would lose over {MAX_LOSS_FRACTION:.0%} of its time "
        f"recovering{hint} (or set --preemption-rate if you know the rate is lower)"
    )


def recovery_note(plan: Plan) -> str:
    """One sentence: what the other recovery mode would choose, or cost, beside this plan's."""
    request, choice, other = plan.request, plan.choice, plan.other_choice
    mode = request.other_recovery
    if request.recovery is Recovery.NODE:
        lost, window = request.nodes - min_replicas(request.nodes) + 1, request.recovery_minutes
        share = gang_failure_probability(request.nodes, choice.preemption_rate, window / 60)
        head = (
            f"with node recovery {share:.1%} of losses relaunch the gang ({lost} of "
            f"{request.nodes} nodes lost within {window:g} min); gang recovery would"
        )
    else:
        head = "--recovery node (for a script using mncloud.train.Replicas) would"
    if other is None:
        return f"{head} find no offer that can finish within budget"
    mine, theirs = choice.by_recovery[mode], other.by_recovery[mode]  # 2+ nodes: both modes
    if mine.viable and mine.cost <= theirs.cost:
        return f"{head} cost ${mine.cost:,.2f} here"
    here = (
        f"${mine.cost:,.2f} here"
        if mine.viable
        else f"here it would lose over {MAX_LOSS_FRACTION:.0%} of its time recovering"
    )
    return f"{head} choose {other.market} {other.where} at ${theirs.cost:,.2f} ({here})"


def explain(ranked: list[Candidate], request: PlanRequest, excluded: list[Exclusion]) -> str:
    """One line: why the choice won."""
    choice = ranked[0]
    head = (
        f"{choice.market} {choice.where} wins at ${choice.expected_cost:,.2f} expected for "
        f"{request.work}" + _speed(choice, request)
    )
    faster = speed_note(ranked, request)
    if faster:
        head += f" ({faster})"
    other = next((c for c in ranked if c.spot != choice.spot), None)
    if other is not None and choice.spot:
        saving = 1 - choice.expected_cost / other.expected_cost
        return (
            f"{head} ({choice.expected_preemptions:.1f} preemptions priced in), {saving:.0%} less "
            f"than the cheapest on-demand, {other.where} at ${other.expected_cost:,.2f}"
        )
    if other is not None:
        return (
            f"{head}: the cheapest spot, {other.where} at ${other.hourly_per_node:,.2f}/h per "
            f"node, would cost ${other.expected_cost:,.2f} once its "
            f"{other.expected_preemptions:.1f} expected preemptions are priced in"
        )
    reason = f"{head}: the cheapest {choice.market} offer"
    if request.spot is SpotPolicy.EITHER:
        missing = "on-demand" if choice.spot else "spot"
        why = [f"{e.cloud}: {e.reason}" for e in excluded]
        reason += f"; no {missing} offer fits" + (f" ({'; '.join(why)})" if why else "")
    else:
        # The runner-up worth naming is another cloud or instance type, not another region.
        nxt = next(
            (
                c
                for c in ranked
                if (c.cloud, c.instance_type) != (choice.cloud, choice.instance_type)
            ),
            None,
        )
        if nxt is not None:
            reason += f"; next best is {nxt.where} at ${nxt.expected_cost:,.2f}"
    return reason


def _speed(choice: Candidate, request: PlanRequest) -> str:
    """`, 0.18 s a step (3.1 h of work)` when the plan knows the step, else nothing."""
    if choice.step_seconds is None:
        return ""
    text = f", {choice.step_seconds:.3g} s a step ({choice.work_hours:,.1f} h of work)"
    if request.minimize is Minimize.TIME:
        text += f", the fastest to finish: {choice.expected_hours:,.1f} h expected"
    return text


def speed_note(ranked: list[Candidate], request: PlanRequest) -> str:
    """Where speed decided: a cheaper hour in the same market whose steps are slower (its
    GPUs, or its network), so it would cost more to finish."""
    choice = ranked[0]
    if choice.step_seconds is None:
        return ""
    cheaper = [
        c
        for c in ranked
        if c.spot == choice.spot
        and c.hourly_total < choice.hourly_total
        and (c.step_seconds or 0) > choice.step_seconds * 1.01
    ]
    if not cheaper:
        if request.minimize is Minimize.TIME or len(request.accelerators) < 2:
            return ""
        return "the cheapest hour too"
    c = min(cheaper, key=lambda c: c.hourly_total)
    ratio = (c.step_seconds or 0) / choice.step_seconds
    what = f"{c.accelerator} on " if c.accelerator != choice.accelerator else ""
    return (
        f"{what}{c.cloud} {c.instance_type} is cheaper per hour at ${c.hourly_total:,.2f} "
        f"but {slower_because(c, choice, ratio)}, so it would cost ${c.expected_cost:,.2f} to "
        "finish"
    )


def slower_because(slow: Candidate, fast: Candidate, ratio: float) -> str:
    """Why `slow`'s step takes `ratio` × `fast`'s: its GPUs, or its network."""
    if slow.bound is not None and slow.bound.value == "network":
        return (
            f"its steps take {ratio:.1f}× as long: the network decided ({slow.network} against "
            f"{fast.network or 'one node'})"
        )
    if slow.bound is not None and slow.bound.value == "overhead":
        return f"its steps take {ratio:.1f}× as long (launch overhead)"
    return f"its steps take {ratio:.1f}× as long (slower GPUs)"
