#!/usr/bin/env bash
# Run sweep specs on a CUDA machine for a fixed wall-clock budget, then pack their progress for the trip back.
#
#   bash scripts/gpu_campaign.sh BUDGET_S OUTDIR SPEC:RUNS_DIR:JOBS [SPEC:RUNS_DIR:JOBS ...]
#
# Each sweep trains with `seqmem sweep SPEC --out RUNS_DIR --jobs JOBS --device $DEVICE` (default cuda; one thread
# per worker), all sweeps side by side.  At BUDGET_S seconds (or when all are done) the sweeps are stopped (SIGTERM:
# finished runs are kept, a partial run keeps its newest checkpoint, written every `checkpoint_every` steps) and the
# run directories changed since the start are packed into OUTDIR/runs-K.tar (scripts/pack_runs.py).  Unpack them
# at the repository root with `tar xf`; `seqmem sweep` then resumes the rest anywhere.
#
# Works from a source tree without installing seqmem (PYTHONPATH=src), with the machine's own torch.  Where the
# NVIDIA MPS daemon can be started (root), it is, so the workers' small kernels share the GPU instead of taking
# turns; when a test client cannot reach it, it is stopped again and the sweeps run without it.
set -u
budget=$1 outdir=$2
shift 2
device=${DEVICE:-cuda}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
py=${PYTHON:-python3}
mkdir -p "$outdir"
marker=$(mktemp)
start=$SECONDS
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
mps=0
if [ "$device" = cuda ] && command -v nvidia-cuda-mps-control >/dev/null && [ "${MPS:-1}" = 1 ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d 2>/dev/null \
        && timeout 40 $py -c "import torch; x = torch.ones(4, device='cuda'); assert float(x.sum()) == 4" 2>/dev/null
    then
        mps=1
    else
        echo quit | nvidia-cuda-mps-control 2>/dev/null
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
fi
echo "MPS: $mps  (setup $((SECONDS - start)) s)"
pids=() roots=()
for item in "$@"; do
    IFS=: read -r spec runs jobs <<<"$item"
    roots+=("$runs")
    log="$outdir/$(basename "$spec" .toml).log"
    $py -m seqmem sweep "$spec" --out "$runs" --jobs "$jobs" --device "$device" --no-probe >"$log" 2>&1 &
    pids+=($!)
    echo "started $spec -> $runs (jobs $jobs, pid $!)"
done
any_alive() {  # whether a sweep is still running
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}
while [ $((SECONDS - start)) -lt "$budget" ] && any_alive; do sleep 3; done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for _ in $(seq 20); do any_alive || break; sleep 1; done
for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
sleep 3  # the workers notice their sweep is gone within 2 s and exit (seqmem.sweep.runner._exit_with_parent)
[ $mps = 1 ] && { echo quit | nvidia-cuda-mps-control 2>/dev/null; }
echo "stopped after $((SECONDS - start)) s"
$py scripts/pack_runs.py "$marker" "$outdir" "${roots[@]}" --max-parts "${MAX_PARTS:-6}"
for f in "$outdir"/*.log; do echo "== $f"; grep -v "^W[0-9]" "$f" | tail -n 40; done
