"""How a JobSpec is planned and run: `LaunchOptions`, by concern (`PlanOptions`, `RenderOptions`,
`RehearsalOptions`), and the numbers of a deadline request (`DeadlineOptions`).

Everything `up`, `plan` and `render` take besides the job itself (`mncloud.spec.JobSpec`),
validated once; the run record keeps `LaunchOptions` beside the spec, so `rerun` launches with
the same options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mncloud.errors import SpecError, first_error
from mncloud.options import DEFAULT_HOURS, DEFAULT_IDLE_MINUTES, MAX_HOURS, MAX_USD
from mncloud.spec import NUMBERS, Minimize

#: The fastest a local rehearsal's run time may pass (`--time-scale`): an hour a second.
MAX_TIME_SCALE = 3600.0

#: `--recompute`'s values: what a step recomputes in backward instead of keeping.
RECOMPUTE = ("none", "selective", "full")


class PlanOptions(BaseModel):
    """The planner's options beside the job (`plan`, `render --plan`, `up`): the work, budgets
    and the cost model's inputs. `PlanRequest.from_spec` reads them, field by field."""

    model_config = NUMBERS | ConfigDict(extra="forbid")

    hours: float = Field(DEFAULT_HOURS, gt=0, le=MAX_HOURS)
    """The user's estimate of the work, in hours at full speed (for the plan)."""
    max_cost: float | None = Field(None, gt=0, le=MAX_USD)
    preemption_rate: float | None = Field(None, ge=0, le=60)
    """Spot preemptions per node-hour; more than one a minute is no spot market."""
    learn: bool = False
    recovery_minutes: float | None = Field(None, ge=0, le=7 * 24 * 60)
    ckpt_seconds: float | None = Field(None, ge=0, le=24 * 3600)
    hazards_from: tuple[Path, ...] = ()
    """Spot traces whose measured preemption hazards the plan uses (`--hazards-from`)."""
    steps: int | None = Field(None, ge=1, le=10**12)
    """Optimizer steps to finish (`--steps`): the work, priced by each offer's step time."""
    minimize: Minimize = Minimize.COST
    """What the plan ranks by: `cost` (expected cost to finish) or `time` (expected finish)."""
    params: float | None = Field(None, gt=0, le=1e15)
    """Model parameters, for a step described by flags (no profile)."""
    flops_per_step: float | None = Field(None, gt=0, le=1e24)
    """Model FLOPs of one rank's optimizer step (forward and backward), by flag."""
    tokens_per_step: float | None = Field(None, gt=0, le=1e12)
    """Tokens one rank processes per optimizer step: FLOPs are then 6 × params × tokens."""

    # The step described by flags (`plan`'s step-time model): one block, see plan/profile.py.
    seq_len: int | None = Field(None, gt=0, le=10**8)
    """Tokens per sequence (`--seq-len`): attention adds 12 × layers × hidden × seq_len FLOPs
    per token."""
    layers: int | None = Field(None, gt=0, le=10**5)
    hidden: int | None = Field(None, gt=0, le=10**7)
    recompute: str | None = None
    """Activation recomputation: none, selective or full (None: the least that fits)."""
    micro_batches: int | None = Field(None, ge=1, le=10**6)
    """Micro-batches per optimizer step (gradient accumulation)."""
    grad_bytes: float | None = Field(None, gt=0, le=1e16)
    """Gradient bytes all-reduced per step, where --params is not known."""

    @field_validator("recompute")
    @classmethod
    def _recompute(cls, value: str | None) -> str | None:
        if value is not None and value not in RECOMPUTE:
            raise ValueError(f"--recompute {value!r}: give none, selective or full")
        return value

    @field_validator("minimize", mode="before")
    @classmethod
    def _minimize(cls, value: object) -> object:
        try:
            return Minimize(value)
        except ValueError:
            raise ValueError(f"--minimize {value!r}: give cost or time") from None


class RenderOptions(BaseModel):
    """How the task is written and kept (`render`, `up`): the template and a `--cluster`."""

    model_config = NUMBERS | ConfigDict(extra="forbid")

    template: Path | None = None
    """A user's own Jinja2 task template."""
    cluster: bool = False
    """`up --cluster`: a plain SkyPilot cluster kept up for `mncloud exec` (not a managed
    job: no recovery), torn down after `idle_minutes` without a job."""
    idle_minutes: int = Field(DEFAULT_IDLE_MINUTES, ge=0, le=7 * 24 * 60)
    """`--idle-minutes`: SkyPilot's autostop (with autodown) of a `--cluster` run."""


class RehearsalOptions(BaseModel):
    """The local rehearsal's options (`up --cloud local`): what the local backend models."""

    model_config = NUMBERS | ConfigDict(extra="forbid")

    recovery_delay: float = Field(2.0, ge=0, le=24 * 3600)
    """Local: the modeled seconds to provision a replacement (one node, or the whole gang)
    before it is started (`--provision-delay`)."""
    chaos_preempt_after: float | None = Field(None, ge=0, le=MAX_HOURS * 3600)
    """Local: preempt the last node once, this many seconds after the first step."""
    preflight_always: bool = False
    """Local: the whole preflight at every launch, the bandwidth test included (a relaunch on
    nodes that all predate the run's figure reuses it otherwise)."""
    hourly_price: float | None = Field(None, ge=0, le=MAX_USD)
    """Local: USD per hour for the whole run in its ledger (a deadline rehearsal's prices);
    a cloud run's price comes from the plan."""


#: Keys older run records hold that no option reads any more (dropped on read).
RETIRED_OPTIONS = ("retry_on_error",)


class LaunchOptions(PlanOptions, RenderOptions, RehearsalOptions):
    """How to plan and run a JobSpec: everything `up` takes besides the job itself, by concern
    (`PlanOptions`, `RenderOptions`, `RehearsalOptions`), in one flat record.

    Stored in the run record beside the spec, so `rerun` launches with exactly the same
    options (no round trip through CLI strings); an older record's retired keys
    (`RETIRED_OPTIONS`: `retry_on_error`, always 0 and now `--max-restarts`) are dropped.
    """

    model_config = NUMBERS | ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(key in data for key in RETIRED_OPTIONS):
            return {k: v for k, v in data.items() if k not in RETIRED_OPTIONS}
        return data


class DeadlineOptions(BaseModel):
    """The numbers of a deadline request beside `--deadline` itself (`up`, `plan`, `replay`),
    checked once: finite, and within what makes sense."""

    model_config = NUMBERS | ConfigDict(extra="forbid")

    budget: float | None = Field(None, gt=0, le=MAX_USD)
    """USD: a hard cap (`up`), or the most the run may be expected to cost (`plan`)."""
    time_scale: float | None = Field(None, gt=0, le=MAX_TIME_SCALE)
    """Local rehearsal: run time passes this many times faster than wall time."""
    pace_steps: int | None = Field(None, gt=0, le=10**12)
    """Local rehearsal: `--hours` of work is this many training steps; run time never runs
    ahead of the steps trained (`control/pacing.py`)."""
    spot_price: float | None = Field(None, ge=0, le=MAX_USD)
    """USD per node-hour on spot."""
    on_demand_price: float | None = Field(None, gt=0, le=MAX_USD)
    """USD per node-hour on-demand."""

    @classmethod
    def build(cls, **fields: float | None) -> DeadlineOptions:
        """Validate like the constructor, but raise SpecError with a one-line message."""
        try:
            return cls(**fields)
        except ValidationError as err:
            raise SpecError(first_error(err)) from None
