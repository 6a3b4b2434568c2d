"""mncloud's figures (`records.trackers.figures`) into the run's W&B run, as summary fields,
at the end of each attempt. Only summary fields: a history row would shift the rows W&B
numbers and a resumed attempt rewinds to (`train.trackers.wandb_moment`).

- **Offline** (`WANDB_MODE=offline`, a `--cloud local` run, whose offline runs are on this
  disk): a short offline run of the same id (`resume="allow"`) holding the figures as its
  summary, in `<WANDB_DIR>/mncloud-figures/wandb/` (`FIGURES_DIR`): W&B names an offline run's
  folder by its id and start second, so beside the attempts' runs it could take the folder of
  a relaunch starting in that second. `wandb sync` takes it into the run like the attempts'
  runs. It is made in a child process (`python -m mncloud.records.wandbfigures`), so W&B's
  service never lives in the supervisor, and only when the script did log an offline run of
  that id.
- **Online**: W&B's public API (`wandb.Api().run(path).summary.update`), with the credentials
  of whoever runs mncloud here (`WANDB_API_KEY`, `wandb login`), when `WANDB_PROJECT` says
  where the run is. A cloud run's offline runs are on its nodes: nothing is sent.

Under `--recovery node` every node's W&B run (`<group>-n<k>`) gets the figures. A failure is
the caller's one warning line (`post`), never an error of the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mncloud import constants
from mncloud.records.model import RunRecord
from mncloud.spec import LOCAL_CLOUD, Recovery

#: The folder under `WANDB_DIR` that holds the figures' offline runs.
FIGURES_DIR = "mncloud-figures"
#: Seconds the child process may take (`$MNCLOUD_WANDB_TIMEOUT_S`): W&B's API retries a
#: server that does not answer for longer than `status` should wait.
TIMEOUT_S = 30.0
TIMEOUT_ENV = "MNCLOUD_WANDB_TIMEOUT_S"
#: The caller's W&B settings the child keeps: its login (online), where W&B keeps its own files.
_KEPT = ("WANDB_API_KEY", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")
_MODE, _DIR, _PROJECT, _ENTITY, _BASE_URL = (
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_BASE_URL",
)


def wandb_names(record: RunRecord, envs: Mapping[str, str]) -> tuple[str | None, str]:
    """(group, run id) of `record`'s W&B run as its nodes got them (`render.trackers`): under
    node recovery the group, each node's run `<group>-n<k>`; else no group and the run's id."""
    from mncloud.render.trackers import NODE_SUFFIX_ROOM, wandb_run_id

    if record.spec.get("recovery") == Recovery.NODE.value:
        group = envs.get(constants.WANDB_RUN_GROUP_ENV) or wandb_run_id(
            record.run_id, room=NODE_SUFFIX_ROOM
        )
        return group, group
    return None, envs.get(constants.WANDB_RUN_ID_ENV) or wandb_run_id(record.run_id)


def run_ids(record: RunRecord, envs: Mapping[str, str]) -> list[str]:
    """The W&B run ids of `record`'s run: one, or one per node under node recovery."""
    group, run = wandb_names(record, envs)
    if group is None:
        return [run]
    return [f"{group}-n{k}" for k in range(int(record.spec.get("nodes") or 1))]


def post(record: RunRecord, figures_of: Callable[[], Mapping[str, float]]) -> None:
    """The figures (`figures_of()`, read only when a W&B run will take them) into the run's
    W&B run(s) (module docstring); raises what went wrong."""
    spec = record.spec
    local = spec.get("clouds") == [LOCAL_CLOUD]
    envs = {**(os.environ if local else {}), **(spec.get("envs") or {})}  # local nodes inherit
    mode = (envs.get(_MODE) or "online").lower()
    job: dict[str, Any] = {"project": envs.get(_PROJECT), "entity": envs.get(_ENTITY),
                           "mode": mode}  # fmt: skip
    if mode in ("offline", "dryrun") and local:
        folder = Path(envs.get(_DIR) or ".")
        if not folder.is_absolute():
            folder = Path(spec.get("workdir") or ".") / folder
        ids = run_ids(record, envs)
        job["runs"] = [i for i in ids if any(folder.glob(f"wandb/offline-run-*-{i}"))]
        job["dir"] = str(folder / FIGURES_DIR)  # (none of them: the script logged no W&B run)
    elif mode == "online" and job["project"]:
        job["runs"], job["base_url"] = run_ids(record, envs), envs.get(_BASE_URL)
    if job.get("runs"):
        _in_child({**job, "values": dict(figures_of())})


def _in_child(job: Mapping[str, Any]) -> None:
    """`job` done by `python -m mncloud.records.wandbfigures`, `TIMEOUT_S` at most: W&B's
    service and its API's retries (minutes against a server that does not answer) never
    live in the caller, nor hold it up past the timeout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") or k in _KEPT}
    env.update(WANDB_SILENT="true")
    timeout = float(os.environ.get(TIMEOUT_ENV) or TIMEOUT_S)
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__], input=json.dumps(job), env=env, text=True,
            capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"W&B did not answer within {timeout:g} s") from None
    if done.returncode != 0:
        said = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(said[-1] if said else f"exit {done.returncode}")


def _write(job: Mapping[str, Any]) -> None:
    """The child process: the figures into each run, offline or over W&B's API."""
    import wandb

    if job["mode"] != "online":
        Path(job["dir"]).mkdir(parents=True, exist_ok=True)
        for run_id in job["runs"]:
            run = wandb.init(
                id=run_id, resume="allow", mode="offline", dir=job["dir"],
                project=job["project"], entity=job["entity"],
                settings=wandb.Settings(console="off", silent=True),
            )  # fmt: skip
            run.summary.update(job["values"])
            run.finish()
        return
    base = job.get("base_url")
    api = wandb.Api(overrides={"base_url": base} if base else None, timeout=10)
    where = "/".join(p for p in (job["entity"], job["project"]) if p)
    for run_id in job["runs"]:
        api.run(f"{where}/{run_id}").summary.update(job["values"])


if __name__ == "__main__":
    _write(json.loads(sys.stdin.read()))
