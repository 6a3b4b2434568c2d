#!/usr/bin/env bash
# Set up mncloud for development on a fresh machine: a virtual environment in .venv holding torch
# (CPU or CUDA build, chosen explicitly: see scripts/_torch.sh), mncloud itself (editable) and its
# [dev] extra, every package at the exact version in requirements/lock.txt (the versions CI tested).
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_torch.sh

LOCK=requirements/lock.txt
LOCK_PYTHON=3.11 # the lock is compiled for CPython 3.11 on Linux x86_64 (the project's machines)

# SkyPilot's dry run needs rsync. Install it where we can; otherwise say so (tests that need it
# are skipped with the reason).
if ! command -v rsync >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && apt-get install -y -qq rsync >/dev/null
  else
    echo "note: rsync is missing; install it (e.g. sudo apt-get install rsync) for SkyPilot dry runs" >&2
  fi
fi

# The web view's browser tests (tests/test_ui.py) drive Debian's chromium with Playwright (its own
# browser download is not used). Best effort: setup never fails for it, and says so.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
    { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1; then
    :
  else
    echo "note: chromium is missing and could not be installed (e.g. sudo apt-get install" \
      "chromium); the browser tests of tests/test_ui.py will be skipped" >&2
  fi
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
constraints=(-c "$LOCK")
have=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "$LOCK_PYTHON" ]; then
  echo "note: $LOCK is for Python $LOCK_PYTHON, this is $have: installing the newest versions" \
    "pyproject.toml allows instead of the tested ones" >&2
  constraints=()
fi

install_torch .venv/bin/python "$(sed -n 's/^torch==//p' "$LOCK")"
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${constraints[@]}" -e '.[dev]'
echo "mncloud installed in .venv ($(.venv/bin/mncloud --version)); to use it in this shell:"
echo "  source .venv/bin/activate"
