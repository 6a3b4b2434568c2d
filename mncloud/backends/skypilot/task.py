"""The `sky.Task` (or, for a job group, the `sky.Dag`) a launch hands SkyPilot: the rendered
YAML, secrets from the environment."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING

from mncloud.backends.base import LaunchRequest
from mncloud.backends.skypilot.errors import one_line
from mncloud.errors import BackendError, RenderError

if TYPE_CHECKING:
    import sky


def secret_overrides(
    request: LaunchRequest, environ: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """The task's secrets as `(name, value)` from `environ`; BackendError for a missing one."""
    environ = dict(os.environ if environ is None else environ)
    missing = [name for name in request.spec.secrets if name not in environ]
    if missing:
        raise BackendError(
            f"secret {', '.join(missing)} is not set in your environment; export it before "
            "`mncloud up` (its value is sent to SkyPilot as a secret, never written to files)"
        )
    return [(name, environ[name]) for name in request.spec.secrets]


def build_task(request: LaunchRequest, environ: dict[str, str] | None = None) -> sky.Task:
    """The `sky.Task` for a launch: the rendered YAML, secrets filled from `environ`."""
    import sky

    overrides = secret_overrides(request, environ)
    config = copy.deepcopy(request.task.config)  # SkyPilot pops keys from its argument
    try:
        return sky.Task.from_yaml_config(config, secrets_overrides=overrides or None)
    except Exception as err:  # SkyPilot raises ValueError and its own types
        raise BackendError(f"SkyPilot rejects the task: {one_line(err)}") from None


def build_dag(request: LaunchRequest, environ: dict[str, str] | None = None) -> sky.Dag:
    """A job group's `sky.Dag` (`execution: parallel`), read by SkyPilot's job-group loader
    from the rendered YAML, secrets filled from `environ` into every task."""
    from mncloud.render import jobgroup

    overrides = secret_overrides(request, environ)
    try:
        return jobgroup.load_dag(request.task.yaml_text, overrides)
    except RenderError as err:
        raise BackendError(str(err)) from None
