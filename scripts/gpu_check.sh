#!/usr/bin/env bash
# GPU check of `met bench spec-cost`, in a few minutes on a fresh CUDA box with the repo copied onto it:
#   1. install met from this checkout (offline-tolerant: no dependencies fetched) and check its imports;
#   2. run the GPU tests (pytest -m gpu);
#   3. run a short NVML sweep (plus the drafter's calibration) and check the table it writes: drafting cells to
#      depth 3, the verify of copies to 16 at width 1 (6 at 4, 2 at 16), which on a GPU is nearly flat in depth;
#   4. run a short `met bench policies` on the GPU against that table (issue 7's ratios, with J/token).
# A box that cannot fetch packages needs the wheels of scripts/gpu_wheels.sh (run it where pip works) in .whl/:
# they are installed first. Usage: scripts/gpu_check.sh [OUTDIR]   (default: tables/). Writes OUTDIR/<box_class>/met-tiny-py.toml,
# its .calibration.toml, OUTDIR/policies/ (the policies report, JSON and plot) and OUTDIR/gpu_check.log. Exit status: 0 when every step passed, else 1
# (the log says which failed; every step runs even after a failure).
set -u
cd "$(dirname "$0")/.."
OUTDIR="${1:-tables}"
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
failed=()
say() { echo "== $*" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

say "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(pwd), out $OUTDIR"
run nvidia-smi --query-gpu=name,uuid,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv || true

if compgen -G ".whl/*.whl" > /dev/null; then
    say "install the carried wheels (.whl/, from scripts/gpu_wheels.sh) into /tmp/site"
    run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || failed+=("carried wheels")
fi
say "install met (no dependencies fetched; torch etc. must already be there)"
run python3 -m pip install --no-deps --no-build-isolation -e . -q \
    || run python3 -m pip install --no-deps -e . -q \
    || { say "pip install failed: using the checkout through PYTHONPATH"; export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"; }
MET=(python3 -c 'import sys; from met.cli import main; sys.argv[0] = "met"; main()')  # no console script needed
met() { "${MET[@]}" "$@"; }
run python3 - <<'EOF' || failed+=("imports")
import importlib
missing = []
for name in ("torch", "typer", "rich", "tomli_w", "numpy", "safetensors", "pynvml", "met.cli", "pytest", "hypothesis"):
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(f"{name} ({exc})")
import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
if missing:
    raise SystemExit("missing imports: " + "; ".join(missing))
if not torch.cuda.is_available():
    raise SystemExit("torch sees no CUDA device")
EOF

# Only the files that hold GPU tests: collecting the whole suite would make this depend on all of it.
mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
say "GPU tests: pytest -m gpu ${GPU_TESTS[*]}"
run python3 -m pytest -m gpu -v -rs -p no:cacheprovider "${GPU_TESTS[@]}" || failed+=("gpu tests")

if ! BOX="$(python3 -c 'import torch; from met.engine.identity import box_class
assert torch.cuda.is_available(), "torch sees no CUDA device"; print(box_class("cuda"))' 2>>"$LOG")"; then
    failed+=("no CUDA device: sweep skipped")
    say "gpu_check FAILED: ${failed[*]}"
    exit 1
fi
TABLE="$OUTDIR/$BOX/met-tiny-py.toml"
SWEEP=(--device cuda --widths 1,4,16 --max-depth 3 --verify-depth 16 --repeats 3 --window 1.0 --context-len 256
       --out "$TABLE")
say "short NVML sweep -> $TABLE"
start=$SECONDS
run met bench spec-cost --energy nvml "${SWEEP[@]}"
status=$?
say "sweep exit $status after $((SECONDS - start)) s"
if [ "$status" -eq 69 ]; then
    failed+=("nvml unavailable")
    say "NVML unavailable (exit 69, reason above); measuring wall time only instead"
    run met bench spec-cost --energy none "${SWEEP[@]}" || failed+=("sweep (energy none)")
elif [ "$status" -ne 0 ]; then
    failed+=("nvml sweep (exit $status)")
fi

if [ -f "$TABLE" ]; then
    say "check and show the table"
    run met tables check "$TABLE" || failed+=("tables check")
    run met tables check "${TABLE%.toml}.calibration.toml" || failed+=("calibration check")
    run met tables show "$TABLE" --calibration "${TABLE%.toml}.calibration.toml" || true
fi

if [ -f "$TABLE" ] && [ -f "${TABLE%.toml}.calibration.toml" ]; then
    say "policies on the GPU -> $OUTDIR/policies"
    run timeout 300 "${MET[@]}" bench policies --device cuda --table "$TABLE" --energy auto --prompts 8 --max-tokens 64 \
        --concurrency 1,4,16 --repeats 2 --out-dir "$OUTDIR/policies" || failed+=("policies")
fi

if [ "${#failed[@]}" -eq 0 ]; then
    say "gpu_check passed"
    exit 0
fi
say "gpu_check FAILED: ${failed[*]}"
exit 1
