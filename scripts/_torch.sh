# Sourced by setup.sh and check-newest.sh: install torch into a virtual environment, choosing the
# build explicitly, and say which one it installed.
#
#   install_torch PYTHON VERSION
#
# With a GPU (an `nvidia-smi` that works): the package registry's build, which is the CUDA one.
# Without: PyTorch's CPU wheel index (no NVIDIA libraries, ~0.2 GB instead of several GB); when
# that index cannot be reached within a few seconds, the registry's build of the same version.

TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

_torch_index_reachable() {
  "$1" - "$TORCH_CPU_INDEX/torch/" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=5).close()
EOF
}

_torch_installed() {
  "$1" - <<'EOF'
from importlib import metadata
version = metadata.version("torch")
cuda = any(r.startswith("nvidia") for r in metadata.requires("torch") or [])
build = "CPU" if version.endswith("+cpu") or not cuda else "CUDA"
print(f"torch {version} ({build} build)")
EOF
}

install_torch() {
  local python=$1 version=$2 source
  local pip=("$python" -m pip install --quiet --disable-pip-version-check)
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    source="a GPU answered nvidia-smi: the package registry's build"
    "${pip[@]}" "torch==$version"
  elif _torch_index_reachable "$python"; then
    source="no GPU: PyTorch's CPU wheel index"
    "${pip[@]}" --no-deps --index-url "$TORCH_CPU_INDEX" "torch==$version"
  else
    source="no GPU, and PyTorch's CPU wheel index could not be reached: the package registry's build"
    "${pip[@]}" --no-deps "torch==$version"
  fi
  echo "$(_torch_installed "$python") — $source"
}
