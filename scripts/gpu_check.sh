#!/usr/bin/env bash
# GPU check and measurements of met on a fresh CUDA box with the repo copied onto it, in one call of under ten minutes:
#   1. install met from this checkout (no dependencies fetched; the wheels of .carry/ first) and check its imports;
#   2. run the GPU tests (pytest -m gpu);
#   3. an NVML sweep in float32 (plus the drafter's calibration): OUTDIR/<box_class>/met-tiny-py.float32.toml,
#      drafting cells to depth 4 at widths 1, 4 and 16, the verify of copies to 16 at width 1 (6 at 4, 2 at 16);
#   4. `met bench policies` on it, the planner's workload (16 held-out prompts, 128 tokens, 5 repeats, every policy)
#      with J/token: OUTDIR/policies-float32/;
#   5. with the time left, benchmarks/planner_steps.py at c = 16 on that table (where the planner's host time
#      goes) and benchmarks/peer_transformers.py on the device (4 prompts, 2 repeats): OUTDIR/peer/.
# float32, not the bfloat16 met runs in on a GPU unless told: greedy outputs must be identical across policies and
# widths, and on an H200 bf16's rounding broke that in 135 requests of a short run where fp32 broke none
# (benchmarks/results/nvidia-h200x1/; the bf16 table at tables/nvidia-h200x1/ came from this script at 58bd82d).
# Each step runs under its own time limit inside the whole check's budget, GPU_CHECK_BUDGET seconds (default 555,
# for a call of 600), in the order above; a step with too little time left is skipped and says so. On the H200
# (2026-11-30) setup and tests took 38 s, an NVML sweep 202 s, the policies 191 s.
# The box's python may be another version than the model card's corpus: .carry/stdlib.tgz (scripts/gpu_carry.sh)
# is the card's stdlib, unpacked and named by MET_CORPUS_ROOT, so the prompts are the ones the CPU results used.
# GPU_CHECK_PACK=FILE: after every step, OUTDIR less the log is packed into FILE (a .tgz), so a call cut short still
# brings back what was done. GPU_CHECK_DRY=1: the same steps on this CPU at --quick sizes, without NVML (a dry run of
# the script before a GPU's minutes are spent on it).
# Usage: scripts/gpu_check.sh [OUTDIR]   (default: tables/). Writes OUTDIR/gpu_check.log. Exit status: 0 when every
# step passed, else 1 (the log says which failed; every step runs even after a failure).
set -u
cd "$(dirname "$0")/.."
OUTDIR="${1:-tables}"
BUDGET="${GPU_CHECK_BUDGET:-555}"
PACK="${GPU_CHECK_PACK:-}"
DRY="${GPU_CHECK_DRY:-}"
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
failed=()
say() { echo "== [$SECONDS s] $*" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }
pack() { [ -z "$PACK" ] || tar czf "$PACK" -C "$OUTDIR" --exclude=gpu_check.log --exclude='*.lock' . 2>>"$LOG" \
    || true; }
# limit WANT RESERVE: seconds a step may take: WANT, or less where the budget less RESERVE (for later steps) has less.
limit() { local left=$(( BUDGET - SECONDS - ${2:-0} )); echo $(( left < $1 ? left : $1 )); }

say "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(pwd), out $OUTDIR, budget $BUDGET s${DRY:+ (dry run on the CPU)}"
run nvidia-smi --query-gpu=name,uuid,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv || true

if compgen -G ".carry/wheels/*.whl" > /dev/null && [ -z "$DRY" ]; then
    say "install the carried wheels (.carry/wheels, from scripts/gpu_carry.sh) into /tmp/site"
    run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .carry/wheels/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || failed+=("carried wheels")
fi
if [ -f .carry/stdlib.tgz ]; then
    say "unpack the model card's stdlib (.carry/stdlib.tgz) into /tmp/met-corpus; MET_CORPUS_ROOT names it"
    rm -rf /tmp/met-corpus && mkdir -p /tmp/met-corpus && tar xzf .carry/stdlib.tgz -C /tmp/met-corpus \
        && export MET_CORPUS_ROOT=/tmp/met-corpus || failed+=("corpus")
fi
if [ -z "$DRY" ]; then
    say "install met (no dependencies fetched; torch etc. must already be there)"
    run python3 -m pip install --no-deps --no-build-isolation -e . -q \
        || run python3 -m pip install --no-deps -e . -q \
        || { say "pip install failed: using the checkout through PYTHONPATH"; export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"; }
fi
MET=(python3 -c 'import sys; from met.cli import main; sys.argv[0] = "met"; main()')  # no console script needed
met() { "${MET[@]}" "$@"; }
run python3 - <<'EOF' || failed+=("imports")
import importlib
missing = []
for name in ("torch", "typer", "rich", "tomli_w", "numpy", "safetensors", "pynvml", "fastapi", "uvicorn", "met.cli",
             "pytest", "hypothesis"):
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(f"{name} ({exc})")
import torch
from met.model.corpus import benchmark_files, stdlib_root
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}; "
      f"corpus {stdlib_root()}: {len(benchmark_files())} benchmark files")
if missing:
    raise SystemExit("missing imports: " + "; ".join(missing))
EOF

if [ -n "$DRY" ]; then
    DEVICE=cpu ENERGY=none SIZES=(--quick) WORK=(--quick)
else
    DEVICE=cuda ENERGY=nvml
    SIZES=(--widths 1,4,16 --max-depth 4 --verify-depth 16 --repeats 3 --window 1.0 --context-len 256)
    WORK=(--prompts 16 --max-tokens 128 --concurrency 1,4,16 --repeats 5)
fi

# Only the files that hold GPU tests: collecting the whole suite would make this depend on all of it.
mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
say "GPU tests: pytest -m gpu ${GPU_TESTS[*]}"
run timeout "$(limit 120 420)" python3 -m pytest -m gpu -v -rs -p no:cacheprovider "${GPU_TESTS[@]}" \
    || failed+=("gpu tests")

if ! BOX="$(python3 -c 'import sys, torch; from met.engine.identity import box_class, resolve_run
assert sys.argv[1] == "cpu" or torch.cuda.is_available(), "torch sees no CUDA device"
print(box_class(sys.argv[1], threads=resolve_run(sys.argv[1]).threads))' "$DEVICE" 2>>"$LOG")"; then
    failed+=("no CUDA device: sweeps skipped")
    say "gpu_check FAILED: ${failed[*]}"
    exit 1
fi

# measure DTYPE ENERGY TABLE POLICIES_DIR SWEEP_KEEP POLICIES_KEEP: the sweep (NVML falls back to wall time alone)
# and the policies on its table, each leaving its KEEP seconds of the budget to the steps after it.
measure() {
    local dtype=$1 energy=$2 table=$3 dir=$4 sweep_keep=$5 policies_keep=$6 status lim
    lim=$(limit 240 "$sweep_keep")
    if [ "$lim" -lt 60 ]; then
        failed+=("$dtype sweep: no time left"); say "$dtype sweep skipped: $lim s left"; return
    fi
    say "$dtype sweep ($energy) -> $table, at most $lim s"
    run timeout "$lim" "${MET[@]}" bench spec-cost --device "$DEVICE" --dtype "$dtype" --energy "$energy" \
        "${SIZES[@]}" --out "$table"
    status=$?
    say "$dtype sweep exit $status"
    if [ "$status" -eq 69 ]; then
        failed+=("nvml unavailable")
        energy=none
        say "NVML unavailable (exit 69, reason above); the $dtype sweep again, wall time alone"
        run timeout "$(limit 240 "$sweep_keep")" "${MET[@]}" bench spec-cost --device "$DEVICE" --dtype "$dtype" \
            --energy none "${SIZES[@]}" --out "$table" || failed+=("$dtype sweep (energy none)")
    elif [ "$status" -ne 0 ]; then
        failed+=("$dtype sweep (exit $status)")
    fi
    pack
    [ -f "$table" ] || return
    run met tables check "$table" --device "$DEVICE" --dtype "$dtype" || failed+=("$dtype tables check")
    run met tables check "${table%.toml}.calibration.toml" --device "$DEVICE" --dtype "$dtype" \
        || failed+=("$dtype calibration check")
    run met tables show "$table" --calibration "${table%.toml}.calibration.toml" || true
    lim=$(limit 280 "$policies_keep")
    if [ "$lim" -lt 30 ]; then
        failed+=("$dtype policies: no time left"); say "$dtype policies skipped: $lim s left"; return
    fi
    say "$dtype policies -> $dir, at most $lim s"
    run timeout "$lim" "${MET[@]}" bench policies --device "$DEVICE" --dtype "$dtype" --table "$table" \
        --energy "$energy" "${WORK[@]}" --out-dir "$dir"
    status=$?
    say "$dtype policies exit $status"
    [ "$status" -eq 0 ] || failed+=("$dtype policies (exit $status)")
    pack
}

measure float32 "$ENERGY" "$OUTDIR/$BOX/met-tiny-py.float32.toml" "$OUTDIR/policies-float32" 180 90

# where the planner's time goes at c = 16, where plain decode beat it on the H200 (host work: plans, copy indexes)
lim=$(limit 60 60)
if [ "$lim" -ge 20 ] && [ -f "$OUTDIR/$BOX/met-tiny-py.float32.toml" ]; then
    say "planner_steps at c = 16 on $DEVICE -> $OUTDIR/peer/planner_steps_c16.md, at most $lim s"
    mkdir -p "$OUTDIR/peer"
    run timeout "$lim" python3 benchmarks/planner_steps.py --device "$DEVICE" --dtype float32 --concurrency 16 \
        --policies off,fixed-2,measured --repeats 3 ${DRY:+--max-tokens 16} \
        --table "$OUTDIR/$BOX/met-tiny-py.float32.toml" --out "$OUTDIR/peer/planner_steps_c16.md" \
        || failed+=("planner_steps")
    pack
fi

# met against transformers on the same weights and prompts on this device (plain and best speculation against transformers'), if time is left
lim=$(limit 200 0)
if [ "$lim" -ge 60 ]; then
    say "peer_transformers on $DEVICE -> $OUTDIR/peer, at most $lim s"
    mkdir -p "$OUTDIR/peer"
    run timeout "$lim" python3 benchmarks/peer_transformers.py --device "$DEVICE" --prompts 4 --repeats 2 \
        ${DRY:+--tokens 16} --out "$OUTDIR/peer/peer_transformers.md" || failed+=("peer_transformers")
    pack
else
    say "peer_transformers skipped: $lim s left"
fi

if [ "${#failed[@]}" -eq 0 ]; then
    say "gpu_check passed"
    exit 0
fi
say "gpu_check FAILED: ${failed[*]}"
exit 1
