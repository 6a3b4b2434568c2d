"""Each offer's step time and hours of work, from the request's workload and the hardware facts.

Without a workload every offer does the request's `hours` (the plan ranks by price and
preemptions alone). With one, each offer's step comes from `stepmodel.step_time` on its GPU
(the instance type's variant first) and its network; its hours of work are `steps` × the
step, or, without `--steps`, `hours` scaled by its step over the fastest step of the first
GPU type asked for. An offer whose GPU the data file does not know, or cannot hold the replica,
is excluded with the reason.
"""

from __future__ import annotations

from typing import NamedTuple

from mncloud.catalog import Exclusion, Offer, skyconfig
from mncloud.errors import CatalogError
from mncloud.plan import hardware, learned, sharding
from mncloud.plan.model import PlanRequest
from mncloud.plan.sharding import Layout
from mncloud.plan.stepmodel import GIB, StepTime, Workload, step_time
from mncloud.spec import NetworkTier


class OfferTime(NamedTuple):
    """One offer's step (None without a workload) and its hours of work."""

    step: StepTime | None
    work_hours: float
    network: str
    layout: Layout | None = None


def time_offers(
    offers: list[Offer], request: PlanRequest
) -> tuple[dict[Offer, OfferTime], list[Exclusion]]:
    """Every offer that can run the workload, timed; the others as exclusions with reasons."""
    workload = request.workload
    if workload is None:
        return {o: OfferTime(None, request.hours, "") for o in offers}, []
    steps: dict[Offer, tuple[StepTime, str, Layout]] = {}
    all_efa = request.nodes > 1 and skyconfig.aws_all_efa_cards()  # SkyPilot's config, once
    excluded: dict[tuple[str, str], str] = {}
    for offer in offers:
        gpu = hardware.gpu(offer.accelerator, offer.cloud, offer.instance_type)
        if gpu is None:
            excluded[(offer.cloud, offer.instance_type)] = (
                f"{offer.instance_type}: mncloud/plan/hardware.yaml has no figures for "
                f"{offer.accelerator}, so its step time is unknown"
            )
            continue
        memory = offer.gpu_memory_gib or gpu.memory_gb
        layout = sharding.choose(
            workload,
            memory,
            gpus_per_node=offer.accelerator_count,
            nodes=request.nodes,
            asked=request.parallel,
        )
        if layout is None:
            excluded[(offer.cloud, offer.instance_type)] = _unfit(offer, memory, request)
            continue
        steps[offer] = (*_step(offer, workload, gpu, request, layout, all_efa=all_efa), layout)
    if not steps:
        raise CatalogError(_nothing_fits(offers, request, excluded))
    reference = _reference_seconds(steps, request)
    timed = {}
    for offer, (step, network, layout) in steps.items():
        if request.steps is not None:
            hours = request.steps * step.step_seconds / 3600
        else:
            hours = request.hours * step.step_seconds / reference
        timed[offer] = OfferTime(step, hours, network, layout)
    exclusions = [Exclusion(cloud=cloud, reason=why) for (cloud, _), why in excluded.items()]
    return timed, exclusions


def _step(
    offer: Offer,
    workload: Workload,
    gpu: hardware.GpuFacts,
    request: PlanRequest,
    layout: Layout,
    *,
    all_efa: bool,
) -> tuple[StepTime, str]:
    """The offer's step, and its network in words (multi-node offers).

    The fabric counts as enabled where the render enables it (`network_tier: best` on the
    offer's entry, unless `--network standard`) or where it needs nothing (TCP); AWS EFA at one
    card of its `cards` unless SkyPilot's config gives it them all (`all_efa`). A bandwidth an
    earlier run's preflight measured on this instance type replaces the data file's.
    """
    net = hardware.network(offer.cloud, offer.instance_type)
    best = request.network is NetworkTier.BEST
    enabled = (best and net.fabric.tier_best) or net.fabric.key in {"tcp", "loopback"}
    all_cards = net.fabric.key != "efa" or net.cards == 1 or all_efa
    measured = request.measured_busbw.get(f"{offer.cloud}/{offer.instance_type}")
    if measured:  # kept as at learned.REFERENCE_NODES nodes: rescaled to this plan's count
        busbw = net.fabric.rescale(measured, learned.REFERENCE_NODES, request.nodes)
    else:
        busbw = net.busbw_gbs(enabled=enabled, all_cards=all_cards, nodes=request.nodes)
    step = step_time(
        workload,
        gpu,
        gpus_per_node=offer.accelerator_count,
        nodes=request.nodes,
        inter_busbw_gbs=busbw,
        parallel=layout.parallel,
        recompute=layout.recompute,
    )
    words = ""
    if request.nodes > 1:
        fabric = net.fabric.name if enabled else "TCP"
        if net.fabric.tier_best and not enabled:
            why = "--network standard" if not best else "not enabled by SkyPilot on VMs"
            fabric += f" ({net.fabric.name}: {why})"
        gbps = net.rate_gbps(enabled=enabled, all_cards=all_cards)
        cards = "" if all_cards or not enabled else f", 1 of {net.cards} EFA cards"
        words = f"{fabric} {gbps:,.0f} Gbps{cards}" + ("" if net.known else " (assumed)")
        if measured:
            words += f", measured {busbw:,.3g} GB/s"
    return step, words


def _reference_seconds(
    steps: dict[Offer, tuple[StepTime, str, Layout]], request: PlanRequest
) -> float:
    """The step `--hours` is measured on: the fastest offer of the first GPU type asked for
    (else of any type: the first had none that fits)."""
    first = request.accelerator
    own = [
        s.step_seconds
        for o, (s, _, _) in steps.items()
        if (o.accelerator.lower(), o.accelerator_count) == (first.name.lower(), first.count)
    ]
    return min(own or [s.step_seconds for s, _, _ in steps.values()])


def memory_text(workload: Workload) -> str:
    """A replica's memory per GPU in words: the total and its parts."""
    parts = (
        ("weights", workload.weight_bytes),
        ("gradients", workload.grad_bytes),
        ("optimizer", workload.optimizer_bytes),
        ("activations", workload.activation_bytes),
    )
    shown = ", ".join(f"{name} {nbytes / GIB:,.1f}" for name, nbytes in parts if nbytes)
    return f"{workload.memory_bytes / GIB:,.1f} GiB: {shown}"


def _unfit(offer: Offer, memory: float, request: PlanRequest) -> str:
    """Why an offer's GPUs cannot hold the job, sharded as asked (or any way)."""
    workload = request.workload
    assert workload is not None
    how = f"--parallel {request.parallel.value}" if request.parallel else "even sharded"
    total = offer.accelerator_count * request.nodes
    text = (
        f"{offer.instance_type}: {total} × {offer.accelerator} ({memory:g} GiB) cannot hold "
        f"the job {how} ({memory_text(workload)})"
    )
    need = sharding.gpus_needed(workload, memory)
    if need is not None and need > total:
        nodes = -(-need // offer.accelerator_count)
        text += f"; it needs {need} GPUs of {memory:g} GiB: --nodes {nodes}"
    return text


def _nothing_fits(
    offers: list[Offer], request: PlanRequest, excluded: dict[tuple[str, str], str]
) -> str:
    """What would fit when no offer's GPU holds the job (or none has figures)."""
    reasons = "; ".join(dict.fromkeys(excluded.values()))
    unfit = [r for r in excluded.values() if "cannot hold" in r]
    if not unfit:
        return f"no {request.gpus_text} offer can be timed: {reasons}"
    reasons = "; ".join(dict.fromkeys(r.partition(": ")[2] for r in unfit))  # once per GPU
    return (
        f"no {request.gpus_text} offer can hold the job on {request.nodes} node(s): {reasons}; "
        "ask for more nodes, GPUs with more memory, --recompute full or a smaller batch per GPU"
    )
