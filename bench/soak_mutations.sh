#!/usr/bin/env bash
# The cloud fault soak's mutation check, long form (issue #52): each guarded fix taken back
# out in turn (tests/mutations.py), MNCLOUD_MUTATION_SEEDS seeds (default 10) of
# MNCLOUD_MUTATION_FAULTS faults each (default 20), drawn from every fault kind; plus three
# controls with nothing taken out (none may fail). One line per mutation: the seeds that
# caught it (also appended to MNCLOUD_MUTATION_REPORT when set). Exit 0 unless a control failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export MNCLOUD_MUTATION_SEEDS="${MNCLOUD_MUTATION_SEEDS:-10}"
export MNCLOUD_MUTATION_FAULTS="${MNCLOUD_MUTATION_FAULTS:-20}"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m pytest \
  tests/test_soak_mutations.py -k long_form -q -s -p no:cacheprovider "$@"
