"""Names shared by the CLI, the templates and the training side: one source for each."""

from __future__ import annotations

# Environment variables SkyPilot sets on every node (and the local backend mimics).
SKYPILOT_NODE_IPS = "SKYPILOT_NODE_IPS"
SKYPILOT_NODE_RANK = "SKYPILOT_NODE_RANK"
SKYPILOT_NUM_NODES = "SKYPILOT_NUM_NODES"
SKYPILOT_NUM_GPUS_PER_NODE = "SKYPILOT_NUM_GPUS_PER_NODE"
SKYPILOT_TASK_ID = "SKYPILOT_TASK_ID"

# Environment variables mncloud sets for the training script.
CKPT_URI_ENV = "MNCLOUD_CKPT_URI"
RUN_NAME_ENV = "MNCLOUD_RUN_NAME"
PREEMPTION_WATCH_ENV = "MNCLOUD_PREEMPTION_WATCH"
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
