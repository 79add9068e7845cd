#!/usr/bin/env bash
# The GPU check: correctness of every mixer on CUDA, the kernels against their references, and the layer speed table,
# in about 8 minutes on one H100 / H200; writes docs/results/bench/gpu.md and gpu.json (and copies them, with the
# logs, to $OUT when that is set).
#
#   bash scripts/gpu_check.sh prepare     # on a machine with internet: fetch the wheels the GPU machine lacks
#   bash scripts/gpu_check.sh [BUDGET_S]  # on the GPU machine (default budget 470 s)
#
# Stages, each time-boxed so the whole fits the budget (a stage cut short is reported as such, never hidden):
#   setup     Python with CUDA torch (PYTHON, default python3); the gpu extra's packages from ./.whl if there,
#             else pip (which fails quietly where nothing can be reached); versions of what is installed
#   triton    seqmem's own Triton kernels compiled on CUDA against their references: tests/ops/test_*triton*.py
#             (the interpreter tests' shapes, then the benchmark's sizes: head dims 128 and 96, T = 300, bfloat16;
#             a second GPU where there is one) — first, as nothing else checks them on a GPU
#   contract  SEQMEM_TEST_DEVICE=cuda pytest tests/test_contract.py tests/test_device.py (xdist where installed)
#   kernels   fla's and mamba_ssm's kernels against seqmem's references on CUDA: tests/ops/test_backends.py (op
#             and layer level; cold autotuning makes this the slowest to start)
#   bench     seqmem bench speed at the sizes of the GPU issue (bfloat16, d_model 1024, 8 heads of 128, batch 2,
#             4k / 16k / 64k, forward+backward) for every mixer, the baselines on PyTorch and on fla / mamba_ssm
#             side by side; each mixer in turn until the budget is spent (scripts/gpu_bench.py)
#   table     docs/results/bench/gpu.md: card, driver, torch, date, commit, each stage's outcome and the table
#
# A GPU machine that cannot reach the internet needs the wheels brought along: run `prepare` where pip works, then
# carry ./.whl with the working tree (it is git-ignored).  Works from a source tree without installing seqmem
# (PYTHONPATH=src), with the machine's own torch and triton.
set -u
cd "$(dirname "$0")/.."
whl=.whl
if [ "${1:-}" = prepare ]; then
    mkdir -p "$whl"
    # fla-core holds flash-linear-attention's ops (pure Python + Triton; needs einops, torch, triton)
    ${PYTHON:-python3} -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$whl" "fla-core==0.6.0" "einops" \
        && ls -la "$whl"
    exit $?
fi
budget=${1:-470}
start=$SECONDS
py=${PYTHON:-python3}
res=docs/results/bench
logs=$(mktemp -d)
mkdir -p "$res"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
stages="$logs/stages.tsv"
: >"$stages"
left() { echo $((budget - (SECONDS - start))); }
stage() {  # stage NAME SECONDS CMD...: run CMD with a time box, log it, record its outcome
    local name=$1 box=$2 t0=$SECONDS rc
    shift 2
    if [ "$box" -lt 10 ]; then
        echo "== $name: not run, the budget was spent"
        printf '%s\t-\t0\t%s\n' "$name" "not run: the budget was spent" >>"$stages"
        return 1
    fi
    echo "== $name (time box ${box} s, $(left) s of the budget left)"
    timeout --signal=TERM --kill-after=10 "$box" "$@" >"$logs/$name.log" 2>&1
    rc=$?
    tail -n 5 "$logs/$name.log"
    local summary
    summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)|no tests ran|^(=+ )?[0-9]+ (passed|failed)" \
        "$logs/$name.log" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')
    [ $rc = 124 ] || [ $rc = 137 ] && summary="cut at the ${box} s time box${summary:+ ($summary)}"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "${summary:-exit $rc}" >>"$stages"
    return $rc
}

# ---------------------------------------------------------------------------------------------------- setup
echo "== setup"
if ! $py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "no CUDA torch in $py (set PYTHON to one that has it); nothing to check" >&2
    exit 2
fi
site=/tmp/seqmem-gpu-site
if ! $py -c "import fla.ops.delta_rule" 2>/dev/null; then
    if ls "$whl"/*.whl >/dev/null 2>&1; then
        $py -m pip install -q --no-index --no-deps --no-compile --target "$site" "$whl"/*.whl \
            && export PYTHONPATH="$PYTHONPATH:$site"
    else
        timeout 30 $py -m pip install -q --retries 0 --timeout 5 --target "$site" "fla-core==0.6.0" 2>/dev/null \
            && export PYTHONPATH="$PYTHONPATH:$site"
    fi
fi
# mamba_ssm builds CUDA code at install time: only used where it is already installed
$py - >"$logs/versions.txt" 2>&1 <<'EOF'
import importlib, platform, subprocess, torch
def ver(m):
    try:
        mod = importlib.import_module(m)
        return getattr(mod, "__version__", "installed")
    except Exception as e:  # noqa: BLE001
        return f"not installed ({type(e).__name__})"
try:
    drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout.strip()
except Exception:  # noqa: BLE001
    drv = "unknown"
try:
    card = torch.cuda.get_device_name(0)
except Exception as e:  # noqa: BLE001
    card = f"unknown ({type(e).__name__})"
print(f"card\t{card}")
print(f"driver\t{drv or 'unknown'}")
print(f"torch\t{torch.__version__} (CUDA {torch.version.cuda})")
for m in ("triton", "fla", "mamba_ssm"):
    print(f"{m}\t{ver(m)}")
print(f"python\t{platform.python_version()}")
EOF
cat "$logs/versions.txt"
printf 'setup\t0\t%s\t%s\n' "$((SECONDS - start))" "fla: $(grep ^fla "$logs/versions.txt" | cut -f2)" >>"$stages"

# ---------------------------------------------------------------------------------------------------- tests
xdist=()
$py -c "import xdist" 2>/dev/null && xdist=(-n 8)
box=$(( $(left) * 25 / 100 ))
[ $box -gt 120 ] && box=120
stage triton "$box" $py -m pytest $(ls tests/ops/test_*triton*.py 2>/dev/null) -rfs -p no:cacheprovider
box=$(( $(left) * 40 / 100 ))
[ $box -gt 200 ] && box=200
export SEQMEM_TEST_DEVICE=cuda
stage contract "$box" $py -m pytest tests/test_contract.py tests/test_device.py -rf \
    -p no:cacheprovider "${xdist[@]}"
box=$(( $(left) * 15 / 100 ))
[ $box -gt 60 ] && box=60
stage kernels "$box" $py -m pytest tests/ops/test_backends.py -rfs -p no:cacheprovider
unset SEQMEM_TEST_DEVICE

# ---------------------------------------------------------------------------------------------------- bench
box=$(( $(left) - 25 ))
stage bench "$box" $py scripts/gpu_bench.py --budget $((box - 15)) --json "$res/gpu.json"

# ---------------------------------------------------------------------------------------------------- table
$py scripts/gpu_bench.py --write-md "$res/gpu.md" --json "$res/gpu.json" --stages "$stages" \
    --versions "$logs/versions.txt" --logs "$logs"
echo "total $((SECONDS - start)) s"
if [ -n "${OUT:-}" ]; then
    cp "$res/gpu.md" "$OUT/" 2>/dev/null
    cp "$res/gpu.json" "$OUT/" 2>/dev/null
    for f in triton contract kernels bench; do cp "$logs/$f.log" "$OUT/$f.log" 2>/dev/null; done
fi
