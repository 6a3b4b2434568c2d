"""Names shared by the CLI, the templates and the training side: one source for each."""

from __future__ import annotations

# Environment variables SkyPilot sets on every node (and the local backend mimics).
SKYPILOT_NODE_IPS = "SKYPILOT_NODE_IPS"
SKYPILOT_NODE_RANK = "SKYPILOT_NODE_RANK"
SKYPILOT_NUM_NODES = "SKYPILOT_NUM_NODES"
SKYPILOT_NUM_GPUS_PER_NODE = "SKYPILOT_NUM_GPUS_PER_NODE"
SKYPILOT_TASK_ID = "SKYPILOT_TASK_ID"
# JSON {"cluster_name", "cloud", "region", "zone"} of where the task landed (e.g. "cloud": "AWS").
SKYPILOT_CLUSTER_INFO = "SKYPILOT_CLUSTER_INFO"

# Environment variables mncloud sets for the training script.
CKPT_URI_ENV = "MNCLOUD_CKPT_URI"
# `--ckpt-dir`: the folder, backed by the run's bucket, where a script keeps its own files.
CKPT_DIR_ENV = "MNCLOUD_CKPT_DIR"
RESUME_FROM_ENV = "MNCLOUD_RESUME_FROM"
"""`--ckpt-dir`: the path of the newest committed unit the node started with (`checkpoint-40/`);
unset when it started with none. `--resume-args`' `{ckpt}` (`spec/scriptargs.py`)."""
RUN_NAME_ENV = "MNCLOUD_RUN_NAME"
PREEMPTION_WATCH_ENV = "MNCLOUD_PREEMPTION_WATCH"
PREFLIGHT_PASSED_ENV = "MNCLOUD_PREFLIGHT_PASSED"
"""Set by a local `mncloud exec` on nodes whose preflight passed when they came up: the run
script skips it (`templates/run.sh.j2`)."""
BANDWIDTH_KNOWN_ENV = "MNCLOUD_BANDWIDTH_KNOWN"
"""Set by the local supervisor on a relaunch whose nodes all predate the run's published
bandwidth figure (its JSON): the preflight reuses it instead of measuring again (`vm.py`)."""
CLOUD_ENV = "MNCLOUD_CLOUD"
# Set by the local backend: how many CPU threads each rank may use.
CPU_THREADS_ENV = "MNCLOUD_CPU_THREADS"

# User-level configuration.
HOME_ENV = "MNCLOUD_HOME"
CATALOG_DIR_ENV = "MNCLOUD_CATALOG_DIR"
PROJECT_CONFIG_FILE = "mncloud.yaml"

# Rendezvous port torchrun uses on the head node (SkyPilot opens all ports inside a cluster).
DEFAULT_MASTER_PORT = 29500

# Exit code a training process uses when it stopped because of a preemption notice; the
# recovery paths (SkyPilot recover_on_exit_codes, the local supervisor) treat it as a
# preemption, not as a user error.
PREEMPTED_EXIT_CODE = 115  # distinct from torchrun (1), signals (128+N) and the shell (126, 127)

# File a rank creates when it stopped for a preemption notice; run.sh.j2 sets its path per node.
PREEMPT_MARKER_ENV = "MNCLOUD_PREEMPT_MARKER"

# Exit code of a node whose script refused its input (`mncloud.train.ModelMismatch`: a
# checkpoint another model wrote): the same input would be refused again, so the local
# supervisor and the deadline controller end the run instead of retrying it.
REFUSED_EXIT_CODE = 116
# Exit code of a node whose bucket did not answer (sysexits EX_TEMPFAIL: "try again later"):
# the preflight's bucket check failed by transient errors alone, past their retry budget. A
# storage outage, not the user's code nor a broken setup: the local supervisor relaunches after
# a backoff and SkyPilot recovers it (`recover_on_exit_codes`), never counted against
# --max-restarts (`mncloud/doctor/checks.py` says which failures are an outage).
STORAGE_OUTAGE_EXIT_CODE = 75
# File a rank writes its one-line refusal into; run.sh.j2 sets its path per node (the local
# backend names it, to read the line back) and exits REFUSED_EXIT_CODE when it exists.
REFUSED_MARKER_ENV = "MNCLOUD_REFUSED_MARKER"

# Preemption notices (mncloud/train/preempt.py). Base URL of a metadata service to ask instead
# of the cloud's own (tests, the local backend); it may carry a path prefix.
METADATA_URL_ENV = "MNCLOUD_METADATA_URL"
# Which metadata protocol to speak: aws, gcp, azure, all (one thread each) or none. Default:
# the cloud in MNCLOUD_CLOUD; without it, probed (short timeouts) in the watcher thread.
METADATA_PROTOCOL_ENV = "MNCLOUD_METADATA_PROTOCOL"
# Seconds between two polls of a polled endpoint (AWS: 5, Azure: 1; GCP long-polls).
METADATA_POLL_ENV = "MNCLOUD_METADATA_POLL_SECONDS"
# Seconds between two looks for a stop request in the bucket (mncloud/storage/stoprequest.py).
STOP_POLL_ENV = "MNCLOUD_STOP_POLL_SECONDS"
# Seconds a rank assumes it has left after SIGTERM/SIGUSR1 (default 30: torchrun's shutdown
# timeout before its SIGKILL, and GCP's notice).
SIGNAL_NOTICE_ENV = "MNCLOUD_SIGNAL_NOTICE_SECONDS"

# Storage and checkpoints (mncloud/storage/, mncloud/train/ckpt.py).
# How long a bucket operation retries transient failures before it gives up (seconds).
STORAGE_RETRY_SECONDS_ENV = "MNCLOUD_STORAGE_RETRY_SECONDS"
# While this file exists at the root of a file:// bucket, the bucket acts as if it were down.
STORAGE_OUTAGE_MARKER = ".mncloud-outage"
# Local directory where ranks stage checkpoint files before the upload (default: a temp dir).
CKPT_STAGING_ENV = "MNCLOUD_CKPT_STAGING"

# Local backend (mncloud/backends/local/).
# Every process of a local node carries this variable (`<run token>/<node>`), so the supervisor,
# `mncloud chaos` and `mncloud down` find a node's processes, wherever they were reparented.
LOCAL_NODE_TAG_ENV = "MNCLOUD_LOCAL_NODE"
LOCAL_HOST_IDLE_ENV = "MNCLOUD_LOCAL_HOST_IDLE_S"
"""Seconds a local `--cluster` run's warm hosts wait without a job before they exit, instead of
`--idle-minutes` (tests use a few seconds)."""

# `mncloud profile` (mncloud/train/profiler.py): where the script's profile is written, and
# whether it runs under FakeTensorMode (`--meta`: shapes only, no memory).
PROFILE_OUT_ENV = "MNCLOUD_PROFILE_OUT"
PROFILE_META_ENV = "MNCLOUD_PROFILE_META"

# The run id (lineage record) every node gets; see mncloud/records/.
RUN_ID_ENV = "MNCLOUD_RUN_ID"
# Seconds between a rank's telemetry segment writes (mncloud/telemetry/series.py; default 30, a
# local run's nodes 0.5: its figures count the steps a SIGKILLed rank reported).
TELEMETRY_INTERVAL_ENV = "MNCLOUD_TELEMETRY_INTERVAL_S"
# The deadline controller's state in the bucket, in its own SkyPilot task's envs
# (templates/control.yaml.j2): the identity of a run's controller job, whatever its name.
CONTROL_STATE_URI_ENV = "MNCLOUD_CONTROL_STATE_URI"

# Node recovery (`--recovery node`, mncloud/train/ft.py): the mode, this node's replica number,
# the number of replicas, the address peers reach this node at, and torchft's lighthouse.
RECOVERY_ENV = "MNCLOUD_RECOVERY"
REPLICA_ID_ENV = "MNCLOUD_REPLICA_ID"
NUM_REPLICAS_ENV = "MNCLOUD_NUM_REPLICAS"
REPLICA_HOST_ENV = "MNCLOUD_REPLICA_HOST"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
#: Set on a node that node recovery relaunched alone: its preflight checks it alone (no gang to
#: meet, no bandwidth test); the nodes that start together meet and measure the fabric.
REPLACEMENT_ENV = "MNCLOUD_REPLACEMENT"

#: How the model is spread over the GPUs (`up --parallel`: ddp, fsdp or hsdp); unset: the
#: script's own choice (`mncloud.train.parallel`).
PARALLEL_ENV = "MNCLOUD_PARALLEL"


# Local rehearsal prices (`up --deadline --cloud local`, `mncloud replay`), USD per node-hour,
# when none are given: the ~3.3× spot discount of the AWS traces in ../shared/traces
# (p3.2xlarge: $0.918 spot vs $3.06 on-demand).
LOCAL_SPOT_PRICE = 0.918
LOCAL_ON_DEMAND_PRICE = 3.06


def min_replicas(nodes: int) -> int:
    """Under node recovery, the fewest nodes that train on: half, rounded up. With fewer left
    (two of three lost at once), the whole gang is relaunched from the bucket checkpoint.

    Here, on the ground floor, so a training rank (`train/ft.py`) and the planner share it
    without the rank loading the planner's models."""
    return max(1, -(-nodes // 2))


# Experiment trackers (mncloud/render/trackers.py, docs/guides/trackers.md): one tracker run per
# training run. W&B's own variables (the run id every attempt reuses, `allow` resume, the group
# and job type under node recovery), MLflow's (the server and the run `up` created), and the
# TensorBoard folder mncloud keeps across preemptions. A user's own setting of each wins.
WANDB_RUN_ID_ENV = "WANDB_RUN_ID"
WANDB_RESUME_ENV = "WANDB_RESUME"
WANDB_RUN_GROUP_ENV = "WANDB_RUN_GROUP"
WANDB_JOB_TYPE_ENV = "WANDB_JOB_TYPE"
MLFLOW_TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_RUN_ID_ENV = "MLFLOW_RUN_ID"
MLFLOW_EXPERIMENT_NAME_ENV = "MLFLOW_EXPERIMENT_NAME"
MLFLOW_EXPERIMENT_ID_ENV = "MLFLOW_EXPERIMENT_ID"
TB_DIR_ENV = "MNCLOUD_TB_DIR"
#: Read by the Hugging Face Trainer's `TensorBoardCallback`: set to `MNCLOUD_TB_DIR`.
TB_LOGGING_DIR_ENV = "TENSORBOARD_LOGGING_DIR"
#: `--tracker none`: set on every node, mncloud's callbacks then touch no tracker either.
TRACKER_OFF_ENV = "MNCLOUD_TRACKER_OFF"
