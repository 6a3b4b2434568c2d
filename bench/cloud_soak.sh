#!/usr/bin/env bash
# The cloud fault soak, long: MNCLOUD_CLOUD_SOAK_SEEDS seeds (default 10) of
# MNCLOUD_CLOUD_SOAK_FAULTS faults each (default 20) over tests/fakesky (tests/cloudsoak.py).
# Prints one line per seed (faults by kind, looks, launches); exit 0 means 0 violations.
set -euo pipefail
cd "$(dirname "$0")/.."
export MNCLOUD_CLOUD_SOAK_SEEDS="${MNCLOUD_CLOUD_SOAK_SEEDS:-10}"
export MNCLOUD_CLOUD_SOAK_FAULTS="${MNCLOUD_CLOUD_SOAK_FAULTS:-20}"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m pytest \
  tests/test_cloud_soak.py -q -s -p no:cacheprovider "$@"
