#!/usr/bin/env bash
# torchtitan's own trainer on GPUs (NCCL, no site hook), preempted once, resumes from its DCP
# step-N folder. On CPU the same trainer runs through mncloud's local backend
# (tests/test_torchtitan.py, with what mncloud/train/titan.py supplies there); this is the GPU
# run. NOT RUN YET: no GPU was lent to the sessions that wrote it.
#
# Needs a machine with 2+ GPUs and the project's dev install (torchtitan 0.3.0 is in the lock).
# The debug model's tokenizer and text come from examples/torchtitan_train.py --tiny-assets
# (built offline; no torchtitan checkout needed).
#
#   bash bench/torchtitan_gpu.sh [more torchtitan options]
#
# (On CPU, as a check of this script: PYTHONPATH=<a run's site-hook folder> bash
# bench/torchtitan_gpu.sh --training.seq_len 128 --training.local_batch_size 2.)
#
# 1. 2 processes train llama3_debugmodel with checkpoints every 10 steps into $CKPT/step-N;
# 2. once step-10 holds its .metadata (DCP writes it last), the gang is killed (a preemption);
# 3. the same command again: torchtitan loads the newest step-N and finishes 30 steps;
# 4. mncloud names that newest folder as its summary does (storage.frameworkdirs).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
WORK="$(mktemp -d)"
CKPT="$WORK/ckpt"
trap 'rm -rf "$WORK"' EXIT

train() {
  "$PYTHON" -m torch.distributed.run --nproc_per_node=2 --rdzv_endpoint=localhost:29533 \
    examples/torchtitan_train.py --tiny-assets --module llama3 --config llama3_debugmodel \
    --training.steps 30 --checkpoint.enable --checkpoint.interval 10 \
    --parallelism.spmd_backend partial_dtensor --dump_folder "$WORK" --checkpoint.folder "$CKPT" "$@"
}

train "$@" >"$WORK/first.log" 2>&1 &
first=$!
until [ -f "$CKPT/step-10/.metadata" ]; do
  kill -0 "$first" 2>/dev/null || { tail -20 "$WORK/first.log"; echo "first run ended early" >&2; exit 1; }
  sleep 0.2
done
# torchrun's workers may leave its process group: kill the whole tree, as a VM vanishing
"$PYTHON" -c 'import psutil, sys
root = psutil.Process(int(sys.argv[1]))
for proc in [root, *root.children(recursive=True)]:
    proc.kill()' "$first"
wait "$first" 2>/dev/null || true
echo "preempted with: $(ls "$CKPT")"
train "$@" >"$WORK/second.log" 2>&1
grep -m1 -i "loading the checkpoint" "$WORK/second.log"
"$PYTHON" - "$CKPT" <<'PY'
import os, sys
from mncloud.storage.frameworkdirs import newest
root = sys.argv[1]
keys = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
found = newest(keys)
print(f"mncloud's newest checkpoint folder: {found}")
assert found is not None and found.step == 30, found
PY
