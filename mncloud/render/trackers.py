"""One tracker run per training run: the variables every node gets so that each attempt of a
run (a relaunch after a preemption, a replaced node) logs into the same tracker run.

    WANDB_RUN_ID      the run id (`wandb_run_id`: ≤ 64 characters, no slash), every attempt
    WANDB_RESUME      `allow`: the first attempt creates the W&B run, the later ones resume it
    WANDB_RUN_GROUP   under node recovery (each node trains as a world of its own, so each
                      logs a W&B run of its own): the run id; run.sh sets each node's
                      `WANDB_RUN_ID` to `<group>-n<replica>` and `WANDB_JOB_TYPE` to `node-<k>`
    MLFLOW_RUN_ID     the MLflow run `up` created (`mncloud.records.mlflowrun`), when
                      `MLFLOW_TRACKING_URI` is set
    MNCLOUD_TB_DIR    `<--ckpt-dir>/tensorboard`: a logger folder synced file by file, restored
                      on every relaunch (`mncloud.storage.folders.LOG_FOLDERS`)
    TENSORBOARD_LOGGING_DIR
                      the same folder, where the Hugging Face Trainer's `TensorBoardCallback`
                      writes (its only setting for it in transformers 5)

The W&B and MLflow clients read these themselves (the Trainer's `WandbCallback` and
`MLflowCallback`, Lightning's `WandbLogger` through `wandb.init`), so an unchanged script picks
them up. A variable the user set (`--env`) is never replaced.
"""

from __future__ import annotations

import hashlib
import os
import re

from mncloud import constants
from mncloud.spec import JobSpec, Recovery, Tracker

#: The longest id W&B takes for a run.
WANDB_ID_MAX = 64
#: `<--ckpt-dir>/TB_FOLDER`: a logger folder (`LOG_FOLDERS`), so synced file by file.
TB_FOLDER = "tensorboard"
#: Under node recovery each node's W&B run is `<group>-n<replica>` (run.sh.j2): room for it.
NODE_SUFFIX_ROOM = 6
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_.-]")


def wandb_run_id(run_id: str, room: int = 0) -> str:
    """The W&B run id of mncloud run `run_id`: itself when W&B takes it, else its readable
    head and a hash of the whole (unique, ≤ 64 − `room` characters, no slash)."""
    most = WANDB_ID_MAX - room
    clean = _NOT_IN_ID.sub("-", run_id)
    if clean == run_id and len(clean) <= most:
        return clean
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"{clean[: most - len(digest) - 1]}-{digest}"


def tb_dir(ckpt_dir: str) -> str:
    """The TensorBoard folder inside `--ckpt-dir`."""
    return f"{ckpt_dir.rstrip('/')}/{TB_FOLDER}"


def tracker_env(spec: JobSpec, run_id: str | None) -> dict[str, str]:
    """The tracker variables of `spec`'s run (the module docstring), none the user set in
    `--env`; nothing under `--tracker none` or before a run has an id (`render`)."""
    if spec.tracker is Tracker.NONE or run_id is None:
        return {constants.TRACKER_OFF_ENV: "1"} if spec.tracker is Tracker.NONE else {}
    env = {constants.WANDB_RESUME_ENV: "allow"}
    if spec.recovery is Recovery.NODE:  # each node a W&B run of the group (run.sh.j2)
        env[constants.WANDB_RUN_GROUP_ENV] = wandb_run_id(run_id, room=NODE_SUFFIX_ROOM)
    else:
        env[constants.WANDB_RUN_ID_ENV] = wandb_run_id(run_id)
    if spec.ckpt_dir:
        env[constants.TB_DIR_ENV] = env[constants.TB_LOGGING_DIR_ENV] = tb_dir(spec.ckpt_dir)
    # The user's own setting wins: `--env`, and on local nodes (which inherit it) their env.
    own = set(spec.envs) | (set(os.environ) if spec.is_local else set())
    return {k: v for k, v in env.items() if k not in own}
