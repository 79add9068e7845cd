#!/usr/bin/env bash
# One-time (idempotent) set-up of a virtual environment (default .venv) for seqmem.
#
#   bash scripts/setup.sh demo    # torch + seqmem (editable) with the plot extra (matplotlib): what `make demo` needs
#   bash scripts/setup.sh test    # the above + the dev and hf extras (pytest, pytest-xdist, hypothesis, ruff, scipy, triton, transformers)
#   bash scripts/setup.sh plain   # torch + `pip install .` (not editable, no extras): what a user's install gets
#
# torch is installed FIRST and on its own, so that installing seqmem never pulls a build chosen by pip's default:
#   1. a torch already importable in the environment is kept;
#   2. TORCH_INDEX_URL=URL            -> torch==$TORCH_VERSION from that index;
#   3. SEQMEM_TORCH=cuda              -> torch==$TORCH_VERSION from the default index (PyPI: the CUDA build on Linux);
#      SEQMEM_TORCH=cpu               -> the CPU build (below), even where an NVIDIA GPU is present;
#      unset: cuda where `nvidia-smi -L` lists a GPU, cpu otherwise;
#   4. cpu: a wheel of torch==$TORCH_VERSION that pip finds without any index (its find-links: a local wheel
#      directory, e.g. PIP_FIND_LINKS or pip.conf) is used as is; otherwise PyTorch's CPU wheel index
#      (https://download.pytorch.org/whl/cpu, ~200 MB instead of several GB of CUDA libraries); if that index cannot
#      be reached, the default index, with a message saying so.
# Other knobs: PYTHON (interpreter for the venv, default python3), TORCH_VERSION (default 2.13.0), SEQMEM_VENV
# (default .venv), SEQMEM_SETUP_DRY_RUN=1 (print the decisions and the commands instead of running them).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-test}
case "$MODE" in
  demo|test|plain) ;;
  *) echo "usage: $0 [demo|test|plain]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
VENV=${SEQMEM_VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu
DRY=${SEQMEM_SETUP_DRY_RUN:-0}
VPY="$VENV/bin/python"

say() { echo "setup: $*" >&2; }
run() {
  if [ "$DRY" = 1 ]; then
    echo "+ $*"
  else
    "$@"
  fi
}

case "$MODE" in
  demo) stamp="$VENV/.seqmem-demo"; target=(-e ".[plot]") ;;
  test) stamp="$VENV/.seqmem-test"; target=(-e ".[dev,hf,plot]") ;;
  plain) stamp="$VENV/.seqmem-plain"; target=(.) ;;
esac
if [ "$DRY" != 1 ] && [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! scripts/setup.sh -nt "$stamp" ]; then
  exit 0  # up to date
fi

# ------------------------------------------------------------------------------------------ the virtual environment
if [ ! -x "$VPY" ]; then
  if [ "$DRY" = 1 ]; then
    echo "+ $PY -m venv $VENV"
  elif ! "$PY" -m venv "$VENV"; then
    rm -rf "$VENV"
    say "'$PY -m venv' failed. On Debian/Ubuntu install the venv module first: sudo apt install python3-venv"
    say "(seqmem needs Python >= 3.11; choose another interpreter with PYTHON=python3.12 make ...)"
    exit 1
  fi
fi
if [ "$DRY" != 1 ]; then
  "$VPY" -m pip install -q --upgrade pip
fi
# the interpreter that answers pip queries: the venv's, or (dry run before the venv exists) $PY
QPY="$VPY"
[ -x "$QPY" ] || QPY="$PY"

# ----------------------------------------------------------------------------------------------------------- torch
have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# Prints the version of a torch==$TORCH_VERSION wheel that pip can install without any index (find-links only:
# a local wheel directory), or nothing.
local_torch() {
  "$QPY" -m pip install --dry-run --quiet --no-index --no-deps --ignore-installed --report - \
      "torch==$TORCH_VERSION" 2>/dev/null |
    "$QPY" -c 'import json, sys
try:
    print(json.load(sys.stdin)["install"][0]["metadata"]["version"])
except Exception:
    pass' 2>/dev/null || true
}

install_torch() {
  local pip=("$VPY" -m pip install -q)
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    say "torch==$TORCH_VERSION from TORCH_INDEX_URL=$TORCH_INDEX_URL"
    run "${pip[@]}" "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
    return
  fi
  local kind=${SEQMEM_TORCH:-}
  if [ -z "$kind" ]; then
    if have_gpu; then kind=cuda; else kind=cpu; fi
  fi
  case "$kind" in
    cuda)
      say "torch==$TORCH_VERSION from the default index (the CUDA build on Linux; SEQMEM_TORCH=cpu for the CPU one)"
      run "${pip[@]}" "torch==$TORCH_VERSION"
      return ;;
    cpu) ;;
    *) say "SEQMEM_TORCH must be 'cpu' or 'cuda', got '$kind'"; exit 2 ;;
  esac
  local found
  found=$(local_torch)
  if [ -n "$found" ]; then
    say "torch==$found from a local wheel (pip's find-links); no download"
    run "${pip[@]}" "torch==$found"
    return
  fi
  say "torch==$TORCH_VERSION, CPU build, from $CPU_INDEX (override: TORCH_INDEX_URL=... or SEQMEM_TORCH=cuda)"
  if run "${pip[@]}" "torch==$TORCH_VERSION" --index-url "$CPU_INDEX"; then
    return
  fi
  say "could not install torch from $CPU_INDEX (offline, or no wheel for this platform)."
  say "FALLING BACK to the default index: on Linux x86-64 this is the CUDA build, several GB with its NVIDIA"
  say "libraries. Interrupt now and set TORCH_INDEX_URL to a reachable CPU wheel index to avoid it."
  run "${pip[@]}" "torch==$TORCH_VERSION"
}

if [ -x "$VPY" ] && "$VPY" -c "import torch" 2>/dev/null; then
  say "keeping the installed torch $("$VPY" -c 'import torch; print(torch.__version__)')"
else
  install_torch
fi

# --------------------------------------------------------------------------------------------------------- seqmem
say "seqmem: pip install ${target[*]}"
run "$VPY" -m pip install -q "${target[@]}"
if [ "$DRY" != 1 ]; then
  touch "$stamp"
  [ "$MODE" = test ] && touch "$VENV/.seqmem-demo"  # the test install includes the demo's
fi
exit 0
