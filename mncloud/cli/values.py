"""Option values turned into the core's models and checked: durations, the deadline's numbers,
`LaunchOptions` and the `JobSpec` (through `mncloud.request`), and the notices a command prints.

`mncloud.cli.options` re-exports them; commands call them as `opts.spec_from_options(…)`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mncloud.errors import SpecError
from mncloud.options import MAX_HOURS

if TYPE_CHECKING:
    from pydantic import BaseModel

    from mncloud.options import JobOptions
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import DeadlineOptions, LaunchOptions


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", re.ASCII)


def parse_duration(text: str | None, flag: str, *, positive: bool = False) -> float | None:
    """`90`, `90s`, `5m`, `1h` → seconds, at most `MAX_HOURS`; None stays None. `positive`:
    0 is refused too."""
    if text is None:
        return None
    match = _DURATION.fullmatch(text)
    shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}…"
    if not match:
        raise SpecError(f"{flag} {shown}: write a duration like 30s, 5m or 1h")
    value = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if not math.isfinite(value) or value > MAX_HOURS * 3600:
        raise SpecError(f"{flag} {shown}: at most a year ({MAX_HOURS} h), e.g. 30h")
    if positive and value <= 0:
        raise SpecError(f"{flag} {shown}: it must be longer than 0, e.g. 30h")
    return value


def deadline_seconds(text: str | None) -> float | None:
    """`--deadline` in seconds (None without it): one reading for `up`, `plan` and `replay`."""
    return parse_duration(text, "--deadline", positive=True)


def deadline_options(values: dict[str, Any]) -> DeadlineOptions:
    """The numbers beside `--deadline` in a command's parameters, checked (`DeadlineOptions`)."""
    from mncloud.spec.launch import DeadlineOptions

    return DeadlineOptions.build(
        **{k: values.get(k) for k in DeadlineOptions.model_fields if values.get(k) is not None}
    )


def launch_options_from(values: dict[str, Any]) -> LaunchOptions:
    """The LaunchOptions from a command's parameters (its `locals()`), field by field, one
    concern at a time: each field from the parameter of its name; one the command lacks or
    left None keeps the field's declared default (`_said`)."""
    from pydantic import ValidationError

    from mncloud.errors import first_error
    from mncloud.spec.launch import LaunchOptions

    said = _said(values, LaunchOptions)
    try:
        return LaunchOptions(
            # PlanOptions: the work, budgets and the cost model's inputs (the PLANNING group).
            hours=said("hours"),
            max_cost=said("max_cost"),
            preemption_rate=said("preemption_rate"),
            learn=said("learn"),
            recovery_minutes=said("recovery_minutes"),
            ckpt_seconds=said("ckpt_seconds"),
            hazards_from=said("hazards_from"),
            steps=said("steps"),
            minimize=said("minimize"),
            params=said("params"),
            flops_per_step=said("flops_per_step"),
            tokens_per_step=said("tokens_per_step"),
            seq_len=said("seq_len"),
            layers=said("layers"),
            hidden=said("hidden"),
            recompute=said("recompute"),
            micro_batches=said("micro_batches"),
            grad_bytes=said("grad_bytes"),
            # RenderOptions: the template and a `--cluster` (the JOB and CLUSTER groups).
            template=said("template"),
            cluster=said("cluster"),
            idle_minutes=said("idle_minutes"),
            # RehearsalOptions: what the local backend models (the LOCAL group).
            recovery_delay=said("recovery_delay", "--provision-delay"),
            chaos_preempt_after=said("chaos_preempt_after", "--chaos-preempt-after"),
            preflight_always=said("preflight_always"),
            hourly_price=said("hourly_price"),
        )
    except ValidationError as err:
        raise SpecError(first_error(err)) from None


def _said(values: dict[str, Any], model: type[BaseModel]) -> Callable[..., Any]:
    """`said(name)`: the parameter `name` of a command, or the default `model` declares for
    its field where the command has none or it is None; `said(name, flag)` reads a duration
    (`30s`, `5m`) first."""

    def said(name: str, flag: str | None = None) -> Any:
        value = values.get(name)
        if flag is not None and isinstance(value, str):
            value = parse_duration(value, flag)
        if value is None:
            return model.model_fields[name].get_default(call_default_factory=True)
        return value

    return said


def job_options(values: dict[str, Any]) -> JobOptions:
    """The job's options from a command's parameters: each `JobOptions` field from the
    parameter of its name (the MARKET and JOB groups declare one per field)."""
    from mncloud.options import JOB_FIELDS, JobOptions

    return JobOptions(*(values[name] for name in JOB_FIELDS))


def spec_from_options(
    values: dict[str, Any],
    *,
    default_name: Callable[[str], str] | None = None,
    notices: list[str] | None = None,
) -> JobSpec:
    """Build the JobSpec from a command's parameters, through `JobOptions` (`job_options`).

    With `notices`, a request that names no cloud runs locally when SkyPilot has none enabled,
    and the notice saying so is appended (print it with `print_notices` once all is checked).
    """
    from mncloud.request import spec_from

    on_local = None if notices is None else notices.append
    return spec_from(
        values["script"],
        values["script_args"],
        job_options(values),
        default_name=default_name,
        on_local=on_local,
    )


def retry_alias(values: dict[str, Any]) -> str | None:
    """`--retry-on-error N`, deprecated: it is `--max-restarts N` now (one meaning on every
    backend). Sets `max_restarts` in `values`; returns the notice to print, or None."""
    retries = values.get("retry_on_error")
    if retries is None:
        return None
    if values.get("max_restarts") not in (None, retries):
        raise SpecError("--retry-on-error is the old name of --max-restarts; give only one")
    values["max_restarts"] = retries
    return (
        "--retry-on-error is deprecated: use --max-restarts (errors in your code are retried "
        "that many times on every backend; preemptions are always recovered)"
    )


def print_notices(notices: list[str]) -> None:
    """Each notice as one line on stderr: what mncloud decided for the user, not an error."""
    from mncloud.cli._common import one_line

    for notice in notices:
        print(f"notice: {one_line(notice)}", file=sys.stderr)
