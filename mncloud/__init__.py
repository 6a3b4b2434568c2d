"""mncloud: multi-node PyTorch training on the cheapest cloud, resumable through preemptions."""

from __future__ import annotations

__version__ = "0.1.0"
