#!/usr/bin/env bash
# Install everything rookworld needs into .venv (idempotent): torch 2.13.0 first, as the
# machine's pip serves it (PyPI's Linux wheel bundles CUDA; TORCH_INDEX_URL=
# https://download.pytorch.org/whl/cpu takes PyTorch's CPU wheel instead, and a pip whose
# configuration lists a local CPU wheel takes that; docs/guides/scaling.md for a GPU), the
# project with pinned dependencies, and
# Stockfish from the OS package manager when it is missing and we are root; then builds
# the native CPU kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 \
  ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
if ! command -v stockfish >/dev/null 2>&1 && [ ! -x /usr/games/stockfish ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stockfish >/dev/null
  else
    echo "rookworld: Stockfish is missing; install it with: sudo apt-get install -y stockfish" >&2
  fi
fi
# the native CPU kernels (rookworld/backends/fast_gpt2/native.py) are built at first use;
# build them now, so the first run does not pay for it (without a C compiler rookworld uses
# torch's operations)
.venv/bin/python -c "from rookworld.backends.fast_gpt2 import native; native.library()" || true
echo "rookworld: environment ready in .venv"
