#!/usr/bin/env bash
# Wheels of met's pure-Python dependencies that a GPU image may lack (the device image of this project
# has torch, numpy, rich, safetensors, nvidia-ml-py, prometheus-client, httpx, pytest, hypothesis and
# transformers, but not tomli-w, fastapi, uvicorn or pydantic), at the versions installed here, for
# Python 3.12 on x86-64 Linux. Run it where pip can fetch; scripts/gpu_check.sh installs what it finds
# in .whl/ (carry the folder to the GPU box). Usage: scripts/gpu_wheels.sh [PYTHON_VERSION]  (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-3.12}"
NAMES=(tomli-w fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection typer
       opentelemetry-api typing-extensions)
specs=()
for name in "${NAMES[@]}"; do
    specs+=("$name==$(python3 -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$name")")
done
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude  # never committed
rm -rf .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${specs[@]}"
ls .whl
