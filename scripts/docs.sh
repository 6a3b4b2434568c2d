#!/usr/bin/env bash
# The documentation site: `bash scripts/docs.sh serve` (http://127.0.0.1:8000) or
# `bash scripts/docs.sh build [-d DIR]`; any other mkdocs arguments pass through.
# MkDocs and its plugins come with the [dev] extra that scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${DOCS_PYTHON:-.venv/bin/python}"
export NO_MKDOCS_2_WARNING=1  # Material's notice about its successor, on every build
if ! "$py" -c 'import mkdocs, material, mkdocstrings_handlers.python' >/dev/null 2>&1; then
  echo "error: MkDocs is not installed in ${py%/bin/python}; install the dev extras:" \
    "bash scripts/setup.sh (or: pip install -e '.[dev]')" >&2
  exit 2
fi
[ $# -eq 0 ] && set -- serve
exec "$py" -m mkdocs "$@"
