"""The task `mncloud doctor --bandwidth RUN` hands a live cluster: the run's recorded task with
its `run` replaced by the preflight's all-reduce test alone (`templates/bandwidth.sh.j2`).

It keeps what decides the network (the resources, the fabric's environment, the rendezvous
port and NCCL settings) and drops what a measurement does not need: setup (`sky.exec` skips
it), the workdir sync, file mounts, secrets, and `MNCLOUD_RUN_ID`, so node 0 prints the figure
without replacing the one the run's own preflight published at launch. The expectation is the
one the recorded task was rendered with (the plan's choice). Example of the `run` it renders:

    MASTER_ADDR="$(printf '%s\\n' "$SKYPILOT_NODE_IPS" | head -n 1)" … (as the run's own)
    python -m mncloud.doctor node --port "$MASTER_PORT" --expect-gpus 8 --timeout 120 \\
      --bandwidth --expect-busbw 12.5 --fabric 'p5.48xlarge: AWS EFA'
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import yaml

from mncloud import constants
from mncloud.render import (
    RenderedTask,
    _environment,
    _render_text,
    template_variables,
    validate_task_config,
)
from mncloud.spec import JobSpec

TEMPLATE = "bandwidth.sh.j2"
#: The expectation as the rendered preflight line carries it (`templates/run.sh.j2`).
_EXPECTED = re.compile(r"--expect-busbw (\S+) --fabric ('[^']*'|\S+)")
#: What a measurement leaves out of the run's task (see the module docstring).
_DROPPED = ("setup", "workdir", "file_mounts", "secrets")


def recorded_expectation(run: str) -> tuple[float, str] | None:
    """(GB/s, fabric) the preflight of a rendered `run` expects, or None (none rendered)."""
    found = _EXPECTED.search(run)
    if not found:
        return None
    return float(shlex.split(found.group(1))[0]), shlex.split(found.group(2))[0]


def bandwidth_task(
    spec: JobSpec,
    recorded: RenderedTask,
    *,
    minimum: float | None,
    timeout: float,
    template: str | Path | None = None,
) -> RenderedTask:
    """The measurement task for run `spec` from its recorded task (module docstring);
    `minimum` (else the run's `--min-bandwidth`) makes a lower figure fail the job."""
    variables = template_variables(spec, None, None)
    expected = recorded_expectation(str(recorded.config.get("run", "")))
    variables.update(
        bandwidth_expect=expected[0] if expected else None,
        bandwidth_fabric=expected[1] if expected else None,
        bandwidth_min=minimum if minimum is not None else spec.min_bandwidth,
        bandwidth_timeout=f"{timeout:g}",
    )
    extra = Path(template).expanduser().resolve().parent if template else None
    config = copy.deepcopy(recorded.config)
    config["name"] = f"{spec.name}-bandwidth"
    config["run"] = _render_text(_environment(extra), TEMPLATE, variables)
    config["envs"] = {
        k: v for k, v in (config.get("envs") or {}).items() if k != constants.RUN_ID_ENV
    }
    for key in _DROPPED:
        config.pop(key, None)
    validate_task_config(config)
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return RenderedTask(yaml_text=text, config=config, spot=recorded.spot)
