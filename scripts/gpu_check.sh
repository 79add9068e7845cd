#!/usr/bin/env bash
# The GPU check: correctness of every mixer on CUDA, the kernels against their references, and the layer speed table,
# in under 8 minutes on one H100 / H200; writes docs/results/bench/gpu.md and gpu.json, and puts its logs, stage
# outcomes and versions (and copies the page) under $OUT when that is set.
#
#   bash scripts/gpu_check.sh prepare     # on a machine with internet: fetch the wheels the GPU machine may lack
#   bash scripts/gpu_check.sh [BUDGET_S]  # on the GPU machine (default budget 470 s), with ./.whl carried along
#   GPU_CHECK_DRY=1 bash scripts/gpu_check.sh [BUDGET_S]   # print the stages and their time boxes; run nothing
#
# prepare: pure-Python (py3-none-any) wheels into ./.whl (git-ignored; carry it with the working tree): fla-core 0.6.0
#   (flash-linear-attention's ops) and its einops and packaging, pytest with pluggy, iniconfig, pygments,
#   exceptiongroup, tomli, and pytest-xdist with execnet; and .whl/COMMIT, the commit and the count of changed or
#   untracked files (`git status --short`), which the page shows where the tree travels without .git.
#
# Stages (a stage cut short is reported as such, never hidden):
#   setup     the first of $PYTHON, python3, python, /usr/bin/python3, /opt/conda/bin/python whose torch sees CUDA
#             (exit 2 where none does; the one chosen is printed); the committed placeholder page deleted; each
#             wheel of ./.whl unpacked (python -m zipfile: no pip needed) into /tmp/seqmem-gpu-site only where its
#             package does not import on that Python, one probe per package, dependencies first.  That folder is
#             appended to PYTHONPATH, which Python reads before its site-packages — but as it holds nothing but
#             packages that failed to import there, it shadows none of the machine's working ones: the machine's
#             versions win (site.addsitedir in a wrapper would not reach xdist's workers; PYTHONPATH does).
#             fla-core by pip only where no ./.whl was brought.  Versions into versions.txt: numpy (seqmem imports
#             it at module level: the page says so where it is missing), fla with its import error in full, ...
#   triton    seqmem's own Triton kernels compiled on CUDA against their references: tests/ops/test_*triton*.py,
#             the mechanisms' (Lattice, VLA, VORT) listed before the baselines' (SSD, linear attention, delta
#             rules), xdist where it works (compiling is most of the stage)
#             (the interpreter tests' shapes, then the benchmark's sizes: head dims 128 and 96, T = 300, bfloat16;
#             a second GPU where there is one) — first, as nothing else checks them on a GPU
#   contract  SEQMEM_TEST_DEVICE=cuda SEQMEM_BACKENDS=pytorch pytest tests/test_device.py tests/test_contract.py
#             (xdist where it works): seqmem's own forms and Triton kernels; fla is off here, as its float32 calls
#             compute in TF32 (about 1e-3 relative) and the contract allows 2e-4 — the kernels stage checks fla
#   kernels   fla's and mamba_ssm's kernels against seqmem's references on CUDA: tests/ops/test_backends.py and
#             tests/ops/test_vort_gla.py (op and layer level, xdist where it works; a first call of each fla kernel
#             autotunes for about two minutes on an H200, so a short box cuts this stage)
#   bench     seqmem bench speed at the sizes of the GPU issue (bfloat16, d_model 1024, 8 heads of 128, batch 2,
#             4k / 16k / 64k, forward+backward) for every mixer on seqmem's own forms first (attention, the
#             baselines, the five mechanisms, the rest), then the baselines on fla / mamba_ssm (shown beside their
#             own rows), each row after one untimed call that pays compilation and autotuning and profiled once at
#             16k; a decode pass (one token per step at 1k and 4k) after the mechanisms' rows; row by row while
#             the budget lasts, a kernel row only with ~2 minutes more for its autotuning (scripts/gpu_bench.py)
#   table     docs/results/bench/gpu.md: card, driver, torch, date, commit, each stage's outcome, the failed tests
#             by name, and the table — written on every way out (an EXIT/TERM/INT trap), also when a stage was cut
#
# Time boxes at the default budget of 470 s (each test stage gets SIGINT at its box, so pytest prints its summary,
# and SIGKILL 10 s later): setup 30 s (not boxed as a whole; each of its commands is capped) + triton 80 + 10
# + contract 100 + 10 + kernels 110 + 10 + bench (what is left − 30 − 10) + 10 + table 30 = 470: the bench gets
# at least 470 − 30 − 90 − 110 − 120 − 30 − 10 = 80 s, more when stages end early.  Another budget scales the three
# test boxes by (BUDGET − 100) / 370 (100 s: setup, table and four kill-afters), and no box outgrows what is left.
#
# Pytest runs with -v -rfE: every failure is named on its own line as it happens (so also in a stage that is cut),
# and the page counts FAILED / ERROR lines wherever they stand in a line.
#
# Files: $OUT (when set; else a temporary folder) receives triton.log, contract.log, kernels.log, bench.log,
# versions.txt, stages.tsv and gpu.json as they are written, and gpu.md at the end: 8 files, the most a device run
# brings back — write nothing else there.  A page lost to a hard kill can be rewritten from them anywhere:
#   python scripts/gpu_bench.py --write-md gpu.md --json gpu.json --stages stages.tsv --versions versions.txt --logs .
#
# Settings (environment): PYTHON (tried first), GPU_CHECK_DRY=1; for trying the script elsewhere: GPU_CHECK_WHEELS
# (default .whl), GPU_CHECK_SITE (default /tmp/seqmem-gpu-site), GPU_CHECK_RESULTS (default docs/results/bench),
# GPU_CHECK_BENCH_ARGS (extra arguments for scripts/gpu_bench.py).  Works from a source tree without installing
# seqmem (PYTHONPATH=src), with the machine's own torch and triton.  Needs bash >= 4.4.
set -u
cd "$(dirname "$0")/.."
whl=${GPU_CHECK_WHEELS:-.whl}

# ---------------------------------------------------------------------------------------------------- prepare
if [ "${1:-}" = prepare ]; then
    py=${PYTHON:-python3}
    tmp=$(mktemp -d)
    # Python 3.10's versions, which every later Python takes too; --no-deps: each one named
    if ! "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.10 -d "$tmp" \
        "fla-core==0.6.0" einops packaging pytest pluggy iniconfig pygments exceptiongroup tomli pytest-xdist execnet
    then
        echo "prepare: pip download failed; $whl left as it was" >&2
        rm -rf "$tmp"
        exit 1
    fi
    mkdir -p "$whl"
    rm -f "$whl"/*.whl  # one version of each
    mv "$tmp"/*.whl "$whl"/ && rmdir "$tmp"
    printf 'commit\t%s\ndirty\t%s\n' "$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
        "$(git status --short 2>/dev/null | wc -l)" >"$whl/COMMIT"
    ls -la "$whl" && cat "$whl/COMMIT"
    exit 0
fi

budget=${1:-470}
case $budget in '' | *[!0-9]*) echo "usage: $0 [prepare | BUDGET_SECONDS]" >&2; exit 2 ;; esac
dry=${GPU_CHECK_DRY:-0}
res=${GPU_CHECK_RESULTS:-docs/results/bench}
site=${GPU_CHECK_SITE:-/tmp/seqmem-gpu-site}
kill_after=10 setup_s=30 table_s=30
fixed=$((setup_s + table_s + 4 * kill_after))  # 100 s
start=$SECONDS virt=0                           # virt: the clock of a dry run (every stage takes its whole box)
elapsed() { if [ "$dry" = 1 ]; then echo "$virt"; else echo $((SECONDS - start)); fi; }
left() { echo $((budget - $(elapsed))); }
scaled() { echo $(($1 * (budget - fixed) / (470 - fixed))); }  # a box of the default budget, for this one
fit() {  # fit BOX: BOX, or less where what is left must still hold its kill-after, the bench's and the table
    local room=$(($(left) - 2 * kill_after - table_s))
    echo $(($1 < room ? $1 : room))
}
plan() { [ "$dry" = 1 ] && printf '%-9s %6s %6s\n' "$1" "$2" "$(elapsed)"; }

if [ "$dry" = 1 ]; then
    echo "== dry run: budget ${budget} s; stage, box (s), worst-case end (s: every stage takes its box + ${kill_after})"
    virt=$setup_s
    plan setup "$setup_s"
    py=python3 logs=/nonexistent stages=/dev/null
else
    # ------------------------------------------------------------------------------------------------ setup
    echo "== setup"
    py=
    for cand in ${PYTHON:+"$PYTHON"} python3 python /usr/bin/python3 /opt/conda/bin/python; do
        command -v "$cand" >/dev/null 2>&1 || continue
        if timeout 120 "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
            >/dev/null 2>&1; then
            py=$cand
            break
        fi
        echo "   $cand: no CUDA torch"
    done
    if [ -z "$py" ]; then
        echo "no CUDA torch in \$PYTHON, python3, python, /usr/bin/python3 or /opt/conda/bin/python (set PYTHON to" \
            "one that has it); nothing to check" >&2
        exit 2
    fi
    echo "   python: $py ($(command -v "$py"))"
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && logs=$OUT; else logs=$(mktemp -d); fi
    stages=$logs/stages.tsv versions=$logs/versions.txt json=$logs/gpu.json
    : >"$stages"
    : >"$versions"
    mkdir -p "$res"
    rm -f "$res/gpu.md" "$res/gpu.json" "$json"  # the committed placeholder must never pass for this run's result
fi

# -------------------------------------------------------------------------------------- stages and the way out
cur= cur_name= cur_t0=0 finished=0 xdist=()
stage() {  # stage NAME BOX CMD...: run CMD in a time box, log it to $logs/NAME.log, record its outcome
    local name=$1 box=$2 rc summary
    shift 2
    if [ "$box" -lt 10 ]; then
        echo "== $name: not run, the budget was spent"
        printf '%s\t-\t0\t%s\n' "$name" "not run: the budget was spent" >>"$stages"
        plan "$name" "not run"
        return 1
    fi
    if [ "$dry" = 1 ]; then
        virt=$((virt + box + kill_after))
        plan "$name" "$box"
        return 0
    fi
    echo "== $name (time box ${box} s, $(left) s of the budget left)"
    cur_name=$name cur_t0=$SECONDS
    # in the background, so a signal to this script is handled at once (the trap stops the stage's process group:
    # timeout leads one of its own, xdist's workers included)
    timeout --signal=INT --kill-after=$kill_after "$box" "$@" >"$logs/$name.log" 2>&1 &
    cur=$!
    wait "$cur"
    rc=$?
    kill -KILL -- "-$cur" 2>/dev/null  # anything the stage left running
    cur=
    tail -n 5 "$logs/$name.log"
    # pytest's last count line (also after SIGINT), or the bench's own
    summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)|no tests ran|^bench: " \
        "$logs/$name.log" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')
    { [ $rc = 124 ] || [ $rc = 137 ]; } && summary="cut at the ${box} s time box${summary:+ ($summary)}"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - cur_t0))" "${summary:-exit $rc}" >>"$stages"
    return $rc
}
finish() {  # the page from whatever the stages left, on every way out
    [ "$finished" = 1 ] && return
    finished=1
    if [ "$dry" = 1 ]; then
        virt=$((virt + table_s))
        plan table "$table_s"
        return
    fi
    if [ -n "$cur" ]; then
        kill -INT -- "-$cur" 2>/dev/null
        sleep 2
        kill -KILL -- "-$cur" 2>/dev/null
        printf '%s\tsignal\t%s\t%s\n' "$cur_name" "$((SECONDS - cur_t0))" "stopped: the check got a signal" >>"$stages"
    fi
    echo "== table"
    [ -f "$json" ] && cp "$json" "$res/gpu.json"
    timeout "$table_s" "$py" scripts/gpu_bench.py --write-md "$res/gpu.md" --json "$json" --stages "$stages" \
        --versions "$versions" --logs "$logs" --commit-file "$whl/COMMIT"
    local rc=$?
    if [ $rc != 0 ]; then  # never leave no page, nor an old one
        { printf '# GPU check: correctness on CUDA and layer speed (`scripts/gpu_check.sh`)\n\n'
          printf 'The page writer failed (exit %s). Stages (name, exit, seconds, outcome):\n\n' "$rc"
          sed 's/^/    /' "$stages"; } >"$res/gpu.md"
    fi
    [ -n "${OUT:-}" ] && cp "$res/gpu.md" "$OUT/gpu.md"
    echo "total $((SECONDS - start)) s; page $res/gpu.md; logs in $logs"
}
trap finish EXIT
trap 'echo "== the check got a signal: writing the page with what it has" >&2; exit 143' TERM INT HUP

if [ "$dry" != 1 ]; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
    rm -rf "$site" && mkdir -p "$site"
    note() { echo "   $*" && printf '# %s\n' "$*" >>"$versions"; }
    install_missing() {  # MODULE WHEEL [PY]: unpack $whl/WHEEL-*.whl into $site if MODULE does not import
        local mod=$1 name=$2 below=${3:-} f
        [ -n "$below" ] && "$py" -c "import sys; sys.exit(sys.version_info < ($below))" && return 0  # not needed
        timeout 60 "$py" -c "import $mod" >/dev/null 2>&1 && return 0
        f=$(ls "$whl/$name"-*.whl 2>/dev/null | head -n 1)
        if [ -z "$f" ]; then
            note "$mod does not import, and there is no $whl/$name-*.whl"
            return 1
        fi
        "$py" -m zipfile -e "$f" "$site" && note "$mod: installed from $f"
    }
    for spec in "packaging packaging" "einops einops" "pluggy pluggy" "iniconfig iniconfig" "pygments pygments" \
        "exceptiongroup exceptiongroup 3,11" "tomli tomli 3,11" "pytest pytest" "execnet execnet" \
        "xdist pytest_xdist" "fla.ops.delta_rule fla_core"; do
        install_missing $spec
    done
    if ! [ -d "$whl" ] && ! timeout 60 "$py" -c "import fla.ops.delta_rule" >/dev/null 2>&1; then
        timeout 30 "$py" -m pip install -q --retries 0 --timeout 5 --target "$site" "fla-core==0.6.0" einops \
            >/dev/null 2>&1 && note "fla-core installed by pip" || note "no $whl, and pip could not install fla-core"
    fi
    # mamba_ssm builds CUDA code at install time: only used where it is already installed
    timeout 90 "$py" - >>"$versions" 2>&1 <<'EOF'
import importlib, platform, subprocess, sys, traceback
def ver(m):
    try:
        mod = importlib.import_module(m)
        return getattr(mod, "__version__", "installed"), None
    except Exception as e:  # noqa: BLE001
        return f"not installed ({type(e).__name__})", e
try:
    import torch
except Exception as e:  # noqa: BLE001
    print(f"torch\tdoes not import ({type(e).__name__}: {e})")
    raise SystemExit(1)
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
for m in ("numpy", "triton", "mamba_ssm", "pytest", "xdist", "einops", "packaging"):
    print(f"{m}\t{ver(m)[0]}")
v, err = ver("fla")
if err is None:
    v, err = ver("fla.ops.delta_rule")  # the kernels seqmem calls
    v = ver("fla")[0] if err is None else f"installed, but its kernels do not import ({type(err).__name__})"
print(f"fla\t{v}")
if err is not None:
    print("fla_error\t" + " | ".join(f"{type(err).__name__}: {err}".splitlines()))
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    print("".join(f"# {ln}\n" for ln in tb.splitlines()), end="")
print(f"python\t{platform.python_version()} ({sys.executable})")
EOF
    grep -v '^#' "$versions" | sed 's/^/   /'
    if awk -F'\t' '$1 == "numpy" && $2 ~ /^not/ {bad = 1} END {exit !bad}' "$versions"; then
        echo "   numpy is missing: seqmem imports it at module level, so every stage will fail (the page says so)" >&2
    fi
    # xdist where it really works on this Python (a plugin that does not load would fail the whole stage)
    probe=$(mktemp -d)
    echo 'def test_ok(): pass' >"$probe/test_probe.py"
    if timeout 60 "$py" -m pytest -q -p no:cacheprovider -n 2 "$probe/test_probe.py" >/dev/null 2>&1; then
        xdist=(-n 8)
    fi
    rm -rf "$probe"
    fla=$(awk -F'\t' '$1 == "fla" {print $2}' "$versions")
    printf 'setup\t0\t%s\t%s\n' "$((SECONDS - start))" "python $py; fla: ${fla:-?}; xdist: ${xdist[*]:-no}" >>"$stages"
fi

# ---------------------------------------------------------------------------------------------------- tests
# -vv: each test's outcome on its own line, as it ends (the project's addopts carry -q, which would cancel a single
# -v; -vv nets -v and keeps the rest of addopts, its marker filter included)
pytest=("$py" -m pytest -vv --tb=short -p no:cacheprovider)
# the mechanisms' kernels first (Lattice, VLA, VORT), then the baselines' (SSD, linear attention, delta rules): a
# box cut short cuts the last; every test_*triton*.py file is listed (a new one is appended, not dropped)
triton_tests=(tests/ops/test_lattice_triton.py tests/ops/test_vla_triton.py tests/ops/test_vort_triton.py
    tests/ops/test_ssd_triton.py tests/ops/test_linear_triton.py tests/ops/test_delta_triton.py)
for f in tests/ops/test_*triton*.py; do
    case " ${triton_tests[*]} " in *" $f "*) ;; *) triton_tests+=("$f") ;; esac
done
# xdist where it works: most of this stage is compiling kernels on the CPU (84 of 89 tests in the 95 s box of the
# first H200 run, serially), which the workers share out
stage triton "$(fit "$(scaled 80)")" "${pytest[@]}" -rfEs "${triton_tests[@]}" "${xdist[@]}"
stage contract "$(fit "$(scaled 100)")" env SEQMEM_TEST_DEVICE=cuda SEQMEM_BACKENDS=pytorch \
    "${pytest[@]}" -rfE tests/test_device.py tests/test_contract.py "${xdist[@]}"
# xdist here too: a first call of each fla kernel autotunes for about two minutes (seen on an H200), most of it
# compiling on the CPU; each worker pays its own kernels' autotuning, but the workers pay theirs side by side
stage kernels "$(fit "$(scaled 110)")" env SEQMEM_TEST_DEVICE=cuda \
    "${pytest[@]}" -rfEs tests/ops/test_backends.py tests/ops/test_vort_gla.py "${xdist[@]}"

# ---------------------------------------------------------------------------------------------------- bench
box=$(($(left) - table_s - kill_after))
# shellcheck disable=SC2086  # GPU_CHECK_BENCH_ARGS: words
stage bench "$box" "$py" scripts/gpu_bench.py --budget $((box - 15)) --json "${json:-}" ${GPU_CHECK_BENCH_ARGS:-}

# ---------------------------------------------------------------------------------------------------- table
finish  # (also the EXIT trap's)
