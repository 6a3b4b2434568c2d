#!/usr/bin/env bash
# Set up mncloud for development on a fresh machine: a virtual environment in .venv with the
# CPU build of torch, mncloud itself (editable) and its [dev] extra. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# SkyPilot's dry run needs rsync. Install it where we can; otherwise say so (tests that need it
# are skipped with the reason).
if ! command -v rsync >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && apt-get install -y -qq rsync >/dev/null
  else
    echo "note: rsync is missing; install it (e.g. sudo apt-get install rsync) for SkyPilot dry runs" >&2
  fi
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The pinned CPU wheel first: an unpinned torch in a fresh venv pulls a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
echo "mncloud installed in .venv ($(.venv/bin/mncloud --version))"
