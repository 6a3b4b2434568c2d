"""The planner's model and deadline options (`plan`, `render --plan`, `up`, `replay`), declared
once: one help text and one default each. `cli/options.py` re-exports them beside the job's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mncloud.cli.params import DEADLINE_PANEL, LOCAL_PANEL, PLAN_PANEL
from mncloud.constants import LOCAL_ON_DEMAND_PRICE, LOCAL_SPOT_PRICE
from mncloud.options import DEFAULT_CKPT_SECONDS, DEFAULT_HOURS, DEFAULT_RECOVERY_MINUTES

# Planning options shared by `plan` and `up`.
MaxCost = Annotated[
    float | None,
    typer.Option(
        "--max-cost",
        rich_help_panel=PLAN_PANEL,
        help="Budget: most USD the job may be expected to cost.",
    ),
]

PreemptionRate = Annotated[
    float | None,
    typer.Option(
        "--preemption-rate",
        rich_help_panel=PLAN_PANEL,
        help="Spot preemptions per node-hour for every cloud (default: per-cloud priors).",
    ),
]

Learn = Annotated[
    bool,
    typer.Option(
        "--learn",
        rich_help_panel=PLAN_PANEL,
        help="Blend the spot preemptions seen in this machine's run records into the priors.",
    ),
]

RecoveryMinutes = Annotated[
    float | None,
    typer.Option(
        "--recovery-minutes",
        rich_help_panel=PLAN_PANEL,
        help=f"Minutes from a preemption to training again ({DEFAULT_RECOVERY_MINUTES:g}).",
    ),
]

CkptSeconds = Annotated[
    float | None,
    typer.Option(
        "--ckpt-seconds",
        rich_help_panel=PLAN_PANEL,
        help=f"Seconds training stalls to save a checkpoint ({DEFAULT_CKPT_SECONDS:g}).",
    ),
]

Hours = Annotated[
    float,
    typer.Option(
        "--hours",
        rich_help_panel=PLAN_PANEL,
        min=0.0,
        show_default=False,
        help=f"Hours of work the job needs without interruptions, for the plan (without it: "
        f"{DEFAULT_HOURS:g}); up --deadline needs it given.",
    ),
]

Steps = Annotated[
    int | None,
    typer.Option(
        "--steps",
        rich_help_panel=PLAN_PANEL,
        help="The work as optimizer steps: each offer's hours are steps × its step time (from "
        "`mncloud profile SCRIPT`, or --flops-per-step / --params with --tokens-per-step).",
    ),
]

Minimize = Annotated[
    str | None,
    typer.Option(
        "--minimize",
        rich_help_panel=PLAN_PANEL,
        help="Rank by expected cost to finish (cost, the default) or expected time to finish "
        "(time, within --max-cost / --max-hourly).",
    ),
]

Params = Annotated[
    float | None,
    typer.Option(
        "--params",
        rich_help_panel=PLAN_PANEL,
        help="Model parameters (e.g. 7e9), for a step described by flags instead of a profile.",
    ),
]

FlopsPerStep = Annotated[
    float | None,
    typer.Option(
        "--flops-per-step",
        rich_help_panel=PLAN_PANEL,
        help="Model FLOPs of one GPU's optimizer step, forward and backward (instead of a "
        "profile).",
    ),
]

TokensPerStep = Annotated[
    float | None,
    typer.Option(
        "--tokens-per-step",
        rich_help_panel=PLAN_PANEL,
        help="Tokens one GPU processes per optimizer step: with --params, FLOPs are 6 × params "
        "× tokens.",
    ),
]

# The step described by flags beside --params (#44): one block, declared once each.
SeqLen = Annotated[
    int | None,
    typer.Option(
        "--seq-len",
        rich_help_panel=PLAN_PANEL,
        help="Tokens per sequence: with --layers and --hidden, attention adds 12 × layers × "
        "hidden × seq-len FLOPs per token.",
    ),
]
Layers = Annotated[
    int | None,
    typer.Option("--layers", rich_help_panel=PLAN_PANEL, help="Transformer layers (blocks)."),
]
Hidden = Annotated[
    int | None,
    typer.Option("--hidden", rich_help_panel=PLAN_PANEL, help="Transformer width (d_model)."),
]
Recompute = Annotated[
    str | None,
    typer.Option(
        "--recompute",
        rich_help_panel=PLAN_PANEL,
        help="Activation recomputation: none, selective (the attention core) or full (one more "
        "forward). Default: the least that fits the GPU.",
        show_default=False,
    ),
]
MicroBatches = Annotated[
    int | None,
    typer.Option(
        "--micro-batches",
        rich_help_panel=PLAN_PANEL,
        help="Micro-batches per optimizer step (gradient accumulation): DDP communicates once "
        "per step, FSDP per micro-batch.",
    ),
]
GradBytes = Annotated[
    float | None,
    typer.Option(
        "--grad-bytes",
        rich_help_panel=PLAN_PANEL,
        help="Gradient bytes all-reduced per step, where --params is not given.",
    ),
]

# `plan`-only flags (#44): how the model is spread, the table's width, profiling on demand.
PlanParallel = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        rich_help_panel=PLAN_PANEL,
        help="auto, ddp, fsdp or hsdp: how the plan spreads the model over the GPUs. auto: DDP "
        "when a replica fits one GPU, HSDP when the state sharded over a node fits, else FSDP.",
        show_default=False,
    ),
]
Wide = Annotated[
    bool,
    typer.Option(
        "--wide", help="Show every column (the default table fits 80 columns).", show_default=False
    ),
]
ProfileFirst = Annotated[
    bool,
    typer.Option(
        "--profile",
        help="With SCRIPT and --steps: profile the script here first when it has no fresh "
        "profile for these arguments.",
        show_default=False,
    ),
]

# Deadline runs (`up --deadline`, the controller is `mncloud control`; `plan --deadline`, its
# estimate; `replay --deadline`, a policy over a trace). One option, read by `deadline_seconds`.
Deadline = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        rich_help_panel=DEADLINE_PANEL,
        help="Finish within this long of the start (e.g. 30h, 90m) at the least cost: a policy "
        "switches between spot and on-demand to meet it.",
    ),
]

Budget = Annotated[
    float | None,
    typer.Option(
        "--budget",
        rich_help_panel=DEADLINE_PANEL,
        help="With --deadline: a hard cap in USD. A cloud run expected to cost more is refused, "
        "and a run stops cleanly (checkpoint kept) before it would cross it. (`plan --budget` "
        "only warns.)",
    ),
]

SpotTrace = Annotated[
    list[Path] | None,
    typer.Option(
        "--spot-trace",
        rich_help_panel=LOCAL_PANEL,
        help="Local rehearsal: spot capacity follows this trace "
        '({"metadata": {"gap_seconds": N}, "data": [nodes per tick]}); repeatable: one '
        "place per trace, named by its file name.",
    ),
]

TimeScale = Annotated[
    float | None,
    typer.Option(
        "--time-scale",
        rich_help_panel=LOCAL_PANEL,
        help="Local rehearsal: run time passes this many times faster than wall time "
        "(trace, deadline, --hours).",
    ),
]

PaceSteps = Annotated[
    int | None,
    typer.Option(
        "--pace-steps",
        rich_help_panel=LOCAL_PANEL,
        help="Local rehearsal: --hours of work is this many training steps; run time then "
        "never runs ahead of the steps trained, so a slow machine rehearses the same decisions.",
    ),
]

SpotPrice = Annotated[
    list[float] | None,
    typer.Option(
        "--spot-price",
        rich_help_panel=DEADLINE_PANEL,
        help=f"With --deadline: USD per node-hour on spot (local: {LOCAL_SPOT_PRICE}; clouds: "
        "the plan's); once, or once per place.",
    ),
]

OnDemandPrice = Annotated[
    float | None,
    typer.Option(
        "--on-demand-price",
        rich_help_panel=DEADLINE_PANEL,
        help=f"With --deadline: USD per node-hour on-demand (local: {LOCAL_ON_DEMAND_PRICE}; "
        "clouds: the plan's).",
    ),
]

# `plan --deadline`'s budget (a warning, where `up`'s is a hard cap) and its hazards.
PlanBudget = Annotated[
    float | None,
    typer.Option(
        "--budget",
        rich_help_panel=DEADLINE_PANEL,
        help="With --deadline: most USD the run may be expected to cost; the plan warns above "
        "it. (`up --budget` is a hard cap: refused above it, stopped before crossing it.)",
    ),
]

HazardsFrom = Annotated[
    list[Path] | None,
    typer.Option(
        "--hazards-from",
        rich_help_panel=PLAN_PANEL,
        help="Spot trace JSON to measure preemption hazards from (repeatable); its metadata "
        "`cloud`/`region` or its path says where it applies.",
    ),
]
