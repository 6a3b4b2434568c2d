#!/usr/bin/env bash
# torchtitan's own trainer, preempted once, resumes from its DCP step-N folder: the run that
# cannot happen on this CPU machine (torchtitan 0.3.0 falls back to "cuda" without an
# accelerator, torchtitan/tools/utils.py get_device_info). NOT RUN YET: no GPU was lent to the
# session that wrote it (docs/guides/trainers.md).
#
# Needs, on a machine with 2+ GPUs: torchtitan==0.3.0 installed beside torch (it resolves beside
# torch 2.13.0 with fsspec 2026.2.0, which datasets<4.8 caps), and a torchtitan checkout at
# $TORCHTITAN_REPO for the debug model's tokenizer and its c4_test data (tests/assets).
#
#   TORCHTITAN_REPO=~/torchtitan bash bench/torchtitan_gpu.sh
#
# 1. 2 processes train llama3_debugmodel with checkpoints every 10 steps into $CKPT/step-N;
# 2. once step-10 holds its .metadata (DCP writes it last), the gang is killed (a preemption);
# 3. the same command again: torchtitan loads the newest step-N and finishes 30 steps;
# 4. mncloud names that newest folder as its summary does (storage.frameworkdirs).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${TORCHTITAN_REPO:?set TORCHTITAN_REPO to a torchtitan checkout (tests/assets)}"
PYTHON="${PYTHON:-python}"
WORK="$(mktemp -d)"
CKPT="$WORK/ckpt"
trap 'rm -rf "$WORK"' EXIT

train() {
  (cd "$TORCHTITAN_REPO" && "$PYTHON" -m torch.distributed.run --nproc_per_node=2 \
    --rdzv_endpoint=localhost:29533 -m torchtitan.train \
    --module llama3 --config llama3_debugmodel \
    --training.steps 30 --checkpoint.enable --checkpoint.interval 10 \
    --job.dump_folder "$WORK" --checkpoint.folder ckpt)
}

set -m # the first run in a process group of its own: killed as a whole
train >"$WORK/first.log" 2>&1 &
first=$!
set +m
until [ -f "$CKPT/step-10/.metadata" ]; do
  kill -0 "$first" 2>/dev/null || { tail -20 "$WORK/first.log"; echo "first run ended early" >&2; exit 1; }
  sleep 0.2
done
kill -9 -- "-$(ps -o pgid= "$first" | tr -d ' ')" 2>/dev/null || kill -9 "$first"
wait "$first" 2>/dev/null || true
echo "preempted with: $(ls "$CKPT")"
train >"$WORK/second.log" 2>&1
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
