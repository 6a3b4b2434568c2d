"""The preflight's tracker check: a tracker the run asked for whose package the node lacks is
named before training starts (one warning line each), not found mid-run. A warning, never a
refusal: the training never fails for its tracker.

    MLflow   `MLFLOW_RUN_ID` set (`up` created the run, or the user chose one): `mlflow`
    W&B      `WANDB_API_KEY`, `WANDB_MODE` or `WANDB_PROJECT` set by the user: `wandb`
    TensorBoard  nothing to check (the script's writer brings its own package)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from mncloud import constants

#: (package, the variables that say the run uses it, what it is called).
WATCHED = (
    ("mlflow", (constants.MLFLOW_RUN_ID_ENV,), "MLflow"),
    ("wandb", ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"), "W&B"),
)


def tracker_warnings(env: Mapping[str, str], node: int) -> list[str]:
    """One line for each tracker `env` asks for whose package this node cannot import."""
    if env.get(constants.TRACKER_OFF_ENV):
        return []
    lines = []
    for package, names, tracker in WATCHED:
        said = [name for name in names if env.get(name)]
        if said and importlib.util.find_spec(package) is None:
            lines.append(
                f"preflight: warning on node {node}: {said[0]} asks for {tracker} but the "
                f"{package!r} package is not installed here: pip install {package} (in --setup "
                "or --requirements); the script trains without logging to it"
            )
    return lines
