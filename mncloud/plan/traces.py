"""Spot traces: how many spot nodes a market offered (or a run held) at each tick.

The one model of a trace, read by the plan's hazards (`hazards.py`), the deadline replays and
the controller's simulated markets. Files: `{"metadata": {"gap_seconds": 300}, "data": [0, 16,
11, …], "prices": […]?}` (`../shared/traces/README.md`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mncloud.errors import SpecError, first_error


class TraceMetadata(BaseModel):
    """A trace's metadata: the tick length (other keys are kept and ignored)."""

    model_config = ConfigDict(extra="allow")
    gap_seconds: int = Field(gt=0)


class Trace(BaseModel):
    """A spot trace: nodes offered (or alive) at each tick of `gap_seconds`."""

    model_config = ConfigDict(extra="allow", frozen=True)
    metadata: TraceMetadata
    data: list[int] = Field(min_length=1)
    prices: list[float] | None = None

    @model_validator(mode="after")
    def _counts(self) -> Trace:
        if any(v < 0 for v in self.data):
            raise ValueError("data: node counts must be ≥ 0")
        return self

    @property
    def gap(self) -> int:
        return self.metadata.gap_seconds

    @property
    def hours(self) -> float:
        return len(self.data) * self.gap / 3600

    def available(self, nodes: int) -> np.ndarray:
        """A bool per tick: the trace offers at least `nodes` spot nodes."""
        return np.asarray(self.data) >= nodes


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; SpecError naming the file and the bad field."""
    path = Path(path)
    try:
        raw: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"trace {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"trace {path}: cannot read it ({err})") from None
    except json.JSONDecodeError as err:
        raise SpecError(f"trace {path}: not JSON ({err.msg} at line {err.lineno})") from None
    try:
        return Trace.model_validate(raw)
    except ValidationError as err:
        raise SpecError(first_error(err, f"trace {path}")) from None
