#!/usr/bin/env bash
# The cloud fault soak, long: MNCLOUD_CLOUD_SOAK_SEEDS seeds (default 30) of at most
# MNCLOUD_CLOUD_SOAK_FAULTS faults each (default 20) over tests/fakesky (tests/cloudsoak.py).
# A `down` at a random moment ends its seed's run early: 30 seeds give over 200 faults a test.
# Prints one line per seed (faults by kind, looks, launches); exit 0 means 0 violations.
set -euo pipefail
cd "$(dirname "$0")/.."
export MNCLOUD_CLOUD_SOAK_SEEDS="${MNCLOUD_CLOUD_SOAK_SEEDS:-30}"
export MNCLOUD_CLOUD_SOAK_FAULTS="${MNCLOUD_CLOUD_SOAK_FAULTS:-20}"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m pytest \
  tests/test_cloud_soak.py -q -s -p no:cacheprovider "$@"
