"""What a training script imports: checkpoints, preemption notices, process-group set-up, a
resumable sampler, sharded models (`parallelize`: DDP, FSDP2 or HSDP from one choice, and
`accumulation_steps` for a global batch kept on any world size), the steps and metrics it
reports to the run's telemetry (`report`, `Progress`; `StepTimer` is the moving mean `report`
returns).

    ckpt.py         `CheckpointManager`: asynchronous, verified checkpoints
    saving.py       the asynchronous save pipeline behind `CheckpointManager.save`
    staging.py      staging slots: the CPU copies a checkpoint is written from
    streaming.py    checkpoint files streamed from DCP into S3 multipart uploads
    state.py        what a checkpoint holds of a training state, and how it goes back
    resume.py       `load`: the newest step that verifies, restored in place on every rank
    reader.py       DCP's reader over the bucket: a resume reads only its ranks' byte ranges
    itembytes.py    a saved tensor viewed where its fetched bytes lie (no copy before DCP's)
    fetchplan.py    who fetches which item of a resume (each once), and the exchange rounds
    collectives.py  the checkpoint's own gloo groups and the ranks' agreements
    emergency.py    the emergency save on a preemption notice
    preempt.py      preemption notices, learnt early enough to checkpoint
    ft.py           node recovery over torchft: each node a replica group
    lighthouse.py   torchft's lighthouse on a cloud, and how nodes find it
    dist.py         process-group set-up from torchrun's environment, seeding
    sampler.py      a distributed sampler over one global sample cursor (any world size)
    parallel.py     `parallelize`: DDP, FSDP2 or HSDP from `--parallel`; accumulation steps
    progress.py     what a script reports besides its checkpoints (`Progress`)
    steptime.py     `report(step, loss=…)`: steps, step time, metrics, events
    profiler.py     `mncloud profile`: time a few steps of the script, then stop it
    frameworks.py   what the framework callbacks share: the warning, the profiled state
    sitehook.py     the trainers people use, unchanged: the callbacks the site hook adds
    hf.py           `MncloudCallback` for the Hugging Face Trainer (needs transformers)
    pl.py           `MncloudCallback` for Lightning (needs lightning)
    trackers.py     what Lightning's loggers do not read from the env: one tracker run per run
    mlflowhook.py   a resumed attempt never logs a step twice to the run's MLflow run
    titan.py        torchtitan's trainer: its steps reported; on a CPU-only node, what it needs

Needs torch (`pip install mncloud[train]`); nothing outside `mncloud.train` imports it.
"""

from __future__ import annotations

from mncloud.train.ckpt import CheckpointManager
from mncloud.train.dist import (
    DistInfo,
    barrier,
    cleanup,
    get_rank,
    get_world_size,
    info,
    init_distributed,
    is_main,
    seed_everything,
    wrap_ddp,
)
from mncloud.train.ft import Replicas
from mncloud.train.parallel import accumulation_steps, parallel_mode, parallelize
from mncloud.train.preempt import Notice, Preempted, PreemptionWatcher
from mncloud.train.progress import Progress
from mncloud.train.sampler import ResumableSampler
from mncloud.train.state import ModelMismatch, rng_state, set_rng_state
from mncloud.train.steptime import StepTimer, report

__all__ = [
    "CheckpointManager",
    "DistInfo",
    "ModelMismatch",
    "Notice",
    "Preempted",
    "PreemptionWatcher",
    "Progress",
    "Replicas",
    "ResumableSampler",
    "StepTimer",
    "accumulation_steps",
    "barrier",
    "cleanup",
    "get_rank",
    "get_world_size",
    "info",
    "init_distributed",
    "is_main",
    "parallel_mode",
    "parallelize",
    "report",
    "rng_state",
    "seed_everything",
    "set_rng_state",
    "wrap_ddp",
]
