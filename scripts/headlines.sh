#!/usr/bin/env bash
# The paper headline campaigns, in order, each a resumable `seqmem sweep` (re-run to continue where it stopped;
# finished runs are skipped, partial ones resume from their checkpoints).  Every report is also recorded in the
# paper's docs/results/<paper>/headline.json (`--headline`).
#
#   bash scripts/headlines.sh [calibrate|headline|long|all]     (default: all = calibrate, then headline)
#
# calibrate: the CPU-scale calibrations of VLA, Echo, Elastic, Lattice and VORT (≈ 7 CPU-hours together, VLA's
#            at the paper's size included) — run the
# headline of a paper only where its reference baseline calibrates (see that paper's headline.json).
# headline:  VLA's convolution check, the CPU-scale headlines of Lattice, Elastic and Echo, VLA's copy task, Echo's
#            longer calibration of the cells that did not calibrate in 2,000 steps, Echo's transfer suite at the
#            paper's size (3 seeds), then a second worker on `long` (VORT's grid, should any of it be left),
#            then Echo's MQAR at the longer gap that calibrated (M = 4 gap 256) and the rest of VLA's capacity
#            curve (≈ 14 CPU-hours together left on 2026-11-27).
# long:      VORT's Zipf grid at 1/40 scale, β = 1, then β = 1.5 and 2.0 at β = 1's lrs: a lane of its own
#            (complete on 2026-11-27, partly on a GPU; on a GPU machine, `bash scripts/gpu_campaign.sh` runs
#            these sweeps with many workers side by side).
# A paper's headline runs only once its calibration is recorded as passed: `calibration.calibrated` in its
# headline.json starts with "yes" (set after reading the calibration report against the criterion stated there);
# FORCE=1 runs them all anyway.
# Environment: JOBS (workers, default 2 = this machine's cores), SEQMEM (default .venv/bin/seqmem), FORCE, YES.
# A sweep whose runs left are estimated above 30 CPU-minutes prints its estimate and stops the script (exit 2)
# unless YES=1 (passed on as `seqmem sweep --yes`; `make headlines YES=1`).
# A sweep with fewer runs left than JOBS leaves cores idle; the two phases touch different run directories, so on
# 2 cores they can run side by side as two lanes of one worker each:
#   JOBS=1 bash scripts/headlines.sh long &  JOBS=1 bash scripts/headlines.sh headline
# Checkpoints are git-ignored: before committing run records from a session that ends mid-run, stage the
# unfinished runs' newest good checkpoints (`.venv/bin/python scripts/stage_partial_runs.py`), or a fresh clone
# restarts those runs from step 0.
set -euo pipefail
cd "$(dirname "$0")/.."
SEQMEM=${SEQMEM:-.venv/bin/seqmem}
JOBS=${JOBS:-2}
export OMP_NUM_THREADS=1

sweep() {  # sweep SPEC PAPER DIR [extra args...]
    local spec=$1 paper=$2 dir=$3
    shift 3
    echo "== $spec -> docs/results/$paper/$dir ($(date -u +%H:%M) UTC)"
    "$SEQMEM" sweep "$spec" --out "docs/results/$paper/$dir/runs" --report-dir "docs/results/$paper/$dir" \
        --jobs "$JOBS" --headline "docs/results/$paper/headline.json" $([ "${YES:-}" = 1 ] && echo --yes) "$@"
}

calibrated() {  # calibrated PAPER: exit 0 when the paper's headline.json records a passed calibration
    [ "${FORCE:-0}" = 1 ] && return 0
    python3 - "docs/results/$1/headline.json" <<'PY'
import json, sys
cal = json.load(open(sys.argv[1])).get("calibration") or {}
sys.exit(0 if isinstance(cal, dict) and str(cal.get("calibrated", "")).lower().startswith("yes") else 1)
PY
}

gated() {  # gated PAPER SWEEP-ARGS...: a headline sweep, skipped while the paper is not calibrated
    local paper=$1
    shift
    if calibrated "$paper"; then
        "$@"
    else
        echo "== skipped $2: $paper is not calibrated yet (calibration.calibrated in docs/results/$paper/headline.json)"
    fi
}

calibrate() {
    sweep vla_calibrate vla calibrate
    sweep echo_calibrate_small echo calibrate_small
    sweep elastic_calibrate_small elastic calibrate_small
    sweep elastic_calibrate_drift elastic calibrate_drift
    sweep lattice_calibrate_small lattice calibrate_small
    sweep vort_calibrate_small vort calibrate_small
    # vort_calibrate_small did not calibrate (attention at chance on long lags): the diagnoses — RoPE base 500,000,
    # 1/40 of the lengths, then 1/40 with a wider model (vort_calibrate_long, 6,000 steps at 1/10, is left out: its
    # training accuracy had not moved by step 2,700, and it costs ≈ 4 CPU-hours)
    sweep vort_calibrate_rope vort calibrate_rope
    sweep vort_calibrate_tiny vort calibrate_tiny
    sweep vort_calibrate_tiny_wide vort calibrate_tiny_wide
    # the wide model began to form the recall circuit at the end of its 4,000 steps: 8,000
    sweep vort_calibrate_tiny_wide_long vort calibrate_tiny_wide_long
}

headline() {
    # Each paper's first answer before any paper's second, then the cheaper answers first: Echo's MQAR cell, VLA's
    # convolution check (its Table 9, n = 24, is measured), Lattice, Elastic; then VLA's copy task (≈ 1 CPU-hour),
    # Echo's longer calibration (≈ 1.5), Echo's transfer suite (≈ 4.5) and the rest of VLA's capacity curve (≈ 5).
    # VORT's grid is the `long` lane.
    gated echo sweep echo_mqar_small echo mqar_small --reuse docs/results/echo/calibrate_small/runs
    gated vla sweep vla_conv vla conv
    gated lattice sweep lattice_context_small lattice context_small --reuse docs/results/lattice/calibrate_small/runs
    gated elastic sweep elastic_sampling_small elastic sampling_small --reuse docs/results/elastic/calibrate_drift/runs
    gated vla sweep vla_copy vla copy
    # Echo's cells that did not calibrate in 2,000 steps (M = 32 gap 64, M = 4 gap 256), at 6,000 steps
    sweep echo_calibrate_long echo calibrate_long
    # Echo Tables 2-3 (transfer suite) at the paper's d 128 / 6,000 steps, 3 seeds; each training resumes from its
    # checkpoints
    echo "== seqmem repro echo --scale paper --seeds 3 --no-mqar -> docs/results/echo/transfer_paper"
    "$SEQMEM" repro echo --scale paper --seeds 3 --no-mqar --out docs/results/echo/transfer_paper
    # VORT has no answer yet and every other paper has one: a second worker on VORT's grid beside the `long` lane
    # (a run being trained is locked, so the two lanes share the grid without training a run twice; when nothing
    # is left to start — the rest locked or waiting for a row's lr — this lane goes on)
    long
    # Echo's longer gap (M = 4 gap 256 calibrated at 6,000 steps in echo_calibrate_long): the four models, 3 seeds
    # (≈ 6 CPU-hours; the calibration's two hybrid runs reused)
    gated echo sweep echo_mqar_long echo mqar_long --reuse docs/results/echo/calibrate_long/runs
    # --compile: VLA 0.72x and the paper's DeltaNet 0.68x eager per step (bench train --compile, n = 16's shape)
    # --reuse conv: n = 24's linear-attention-eq3 runs are vla_conv's linear-attention-elu1-noconv (the same layers)
    gated vla sweep vla_capacity vla capacity --reuse docs/results/vla/calibrate/runs --reuse docs/results/vla/conv/runs \
        --compile
}

long() {
    # VORT Table 1 at 1/40 scale, β = 1 (≈ 22 CPU-hours, many sessions): the one campaign far longer than a
    # session, so it runs in a lane of its own beside `headline`.  vort_zipf_small (1/10 scale) is not run: its
    # reference did not calibrate (docs/results/vort/README.md).
    # --compile: VORT's steps through torch.compile, 18-23 % less CPU time per step for the kernel rows (measured
    # 2026-11-26: power-law 627 -> 484 ms, exponential 344 -> 282; attention 352 -> 338) after a one-off compile
    gated vort sweep vort_zipf_tiny vort zipf_tiny --reuse docs/results/vort/calibrate_tiny_wide_long/runs --compile
    # β = 1.5 and 2.0, each row at its β = 1 lr (and λ), 3 seeds (≈ 20 CPU-hours with all four rows; rows are added
    # to the spec as β = 1 chooses them)
    gated vort sweep vort_zipf_tiny_beta vort zipf_tiny_beta --compile
}

case "${1:-all}" in
    calibrate) calibrate ;;
    headline) headline ;;
    long) long ;;
    all) calibrate; headline ;;  # headline ends with long
    *) echo "usage: bash scripts/headlines.sh [calibrate|headline|long|all]" >&2; exit 2 ;;
esac
