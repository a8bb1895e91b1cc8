#!/usr/bin/env bash
# Set up and run nsa_iree on a fresh machine:  ./dev.sh demo   |   ./dev.sh test [pytest args]
# Installs into the current python3: torch 2.13.0 only when no torch is importable, from pip's configured index
# (PyPI's Linux x86-64 wheel is the CUDA build, several GB; set TORCH_INDEX_URL, e.g. to
# https://download.pytorch.org/whl/cpu, for the CPU build, or install torch first), then this package in
# editable mode with its pinned IREE compiler and runtime (and the test tools for `test`).
# `./dev.sh test` runs the whole suite: about 10 minutes on 2 cores, most of it compiling kernels once.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

install() {
  if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  fi
  "$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".$1"
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  demo)
    install ""
    exec "$PYTHON" -m nsa_iree.cli demo "$@"
    ;;
  test)
    install "[test]"
    exec "$PYTHON" -m pytest -q tests "$@"
    ;;
  *)
    echo "usage: ./dev.sh demo | ./dev.sh test [pytest args]" >&2
    exit 2
    ;;
esac
