#!/usr/bin/env bash
# Set up the development environment in .venv: uv, requirements/dev.txt (the cpu
# torch included), and vllm-engine itself installed editable, compiled once.
# Safe to run again: it only adds what is missing and rebuilds what changed.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "uv>=0.9" "packaging>=23"
PYTHON=$REPO/.venv/bin/python
source "$REPO/ci/lib.sh"
uv=$UV
torch_source cpu
"$uv" pip install -q --python .venv/bin/python -r requirements/dev.txt "${TORCH_SOURCE[@]}"
VLLM_TARGET_DEVICE=cpu "$uv" pip install -q --python .venv/bin/python --no-build-isolation -e .
.venv/bin/python -c "import engine; print('vllm-engine', engine.__version__, 'ready:', engine.BUILD_INFO.variant, engine.ops.cpu_isa())"
