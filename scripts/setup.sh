#!/usr/bin/env bash
# One-time (idempotent) set-up: a virtual environment in .venv with the CPU build of torch installed FIRST,
# so that nothing later pulls a multi-GB CUDA build, then seqmem itself with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.seqmem-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # The CPU wheel of torch 2.13.0 lies on disk on this project's machines; elsewhere pip fetches it from the index
  # named in TORCH_INDEX_URL (default: PyTorch's CPU wheel index is NOT assumed; plain PyPI is used).
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
  fi
  .venv/bin/python -m pip install -q -e ".[dev,hf]"
  touch "$stamp"
fi
