#!/usr/bin/env bash
# What a GPU box of this project lacks, gathered here into .carry/ (never committed) for `run` to carry there:
#   .carry/wheels/: met's pure-Python dependencies the device image lacks (it has torch, numpy, rich, safetensors,
#     nvidia-ml-py, prometheus-client, httpx, pytest, hypothesis and transformers, but not tomli-w, fastapi,
#     uvicorn or pydantic), at the versions installed here, for Python 3.12 on x86-64 Linux (pip must fetch);
#   .carry/stdlib.tgz: the .py files of the standard library the model card's corpus was read from (its
#     corpus.root): the box's python is another version, whose stdlib would give other held-out prompts and
#     calibration windows (scripts/gpu_check.sh points MET_CORPUS_ROOT at it).
# Usage: scripts/gpu_carry.sh [PYTHON_VERSION]  (default 3.12), then run `scripts/gpu_check.sh` there, carrying .carry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-3.12}"
NAMES=(tomli-w fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection typer
       opentelemetry-api typing-extensions)
specs=()
for name in "${NAMES[@]}"; do
    specs+=("$name==$(python3 -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$name")")
done
grep -qxF '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude  # never committed
rm -rf .carry
mkdir -p .carry
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .carry/wheels "${specs[@]}"
ROOT="$(python3 -c 'import sys; from met.model.recipes import embedded
print(embedded(sys.argv[1], verify=False).card["corpus"]["root"])' "${MET_RECIPE:-met-tiny-py}")"
(cd "$ROOT" && find . -name site-packages -prune -o -name '*.py' -print0 | tar czf - --null -T -) > .carry/stdlib.tgz
echo "wheels: $(ls .carry/wheels | wc -l); stdlib of $ROOT: $(tar tzf .carry/stdlib.tgz | wc -l) files;" \
     "$(du -sh .carry | cut -f1)"
