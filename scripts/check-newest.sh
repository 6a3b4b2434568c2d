#!/usr/bin/env bash
# Try the newest versions pyproject.toml's ranges allow: resolve them with uv, install them into a
# fresh virtual environment (not .venv), run the suite there (the CLI help walk included) and say
# which versions differ from requirements/lock.txt.
#
#   bash scripts/check-newest.sh [--update-lock] [PYTEST ARGS...]
#
# PYTEST ARGS default to the whole suite; e.g. `-m "not slow"` for a quicker look. With
# --update-lock, a passing run writes the versions it tested into requirements/lock.txt (that is
# how the lock is refreshed); a failing run leaves the lock alone. The environment is kept in
# $NEWEST_DIR (default /tmp/mncloud-newest) for a closer look.
#
# torch: with a GPU, or where PyTorch's CPU wheel index can be reached, the newest allowed torch;
# otherwise it stays at the lock's version (the registry's newest torch is the multi-GB CUDA
# build), and the script says so.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/_torch.sh

update=0
if [ "${1:-}" = "--update-lock" ]; then
  update=1
  shift
fi
LOCK=requirements/lock.txt
DIR="${NEWEST_DIR:-/tmp/mncloud-newest}"
PYTHON="${PYTHON:-python3}"
pip=(--quiet --disable-pip-version-check)

rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
"$PYTHON" -m venv "$DIR/venv" || exit 1
py="$DIR/venv/bin/python"
"$py" -m pip install "${pip[@]}" uv || exit 1

pins=()
locked_torch=$(sed -n 's/^torch==//p' "$LOCK")
if ! { nvidia-smi >/dev/null 2>&1 || _torch_index_reachable "$py"; }; then
  echo "torch stays at $locked_torch: no GPU and no PyTorch CPU index, so the newest torch" \
    "would be the registry's CUDA build"
  echo "torch==$locked_torch" >"$DIR/torch.txt"
  pins=(-c "$DIR/torch.txt")
fi
# The same command that wrote the lock, with --upgrade: the newest the ranges allow.
"$DIR/venv/bin/uv" pip compile --quiet pyproject.toml --extra dev --upgrade --no-annotate \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 "${pins[@]}" \
  --custom-compile-command "bash scripts/check-newest.sh --update-lock" -o "$DIR/lock.txt" ||
  exit 1

echo "versions that differ from $LOCK (< lock, > newest):"
diff <(grep -E '^[A-Za-z0-9]' "$LOCK") <(grep -E '^[A-Za-z0-9]' "$DIR/lock.txt") | grep '^[<>]'
[ "${PIPESTATUS[0]}" -eq 0 ] && echo "  none: the lock is at the newest allowed versions"

install_torch "$py" "$(sed -n 's/^torch==//p' "$DIR/lock.txt")" || exit 1
"$py" -m pip install "${pip[@]}" -c "$DIR/lock.txt" -e '.[dev]' || exit 1

"$py" -m pytest "$@"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "FAILED at the newest versions (pytest exit $rc); the lock is unchanged." \
    "Bound what broke in pyproject.toml." >&2
  exit "$rc"
fi
echo "the suite passes at the newest allowed versions"
if [ "$update" = 1 ]; then
  cp "$DIR/lock.txt" "$LOCK"
  echo "wrote $LOCK; commit it with pyproject.toml"
fi
