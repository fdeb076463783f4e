#!/usr/bin/env bash
# Install one wheel into a fresh virtual environment (with the torch it pins)
# and check it: imports, has the kernels its variant promises, and (where this
# machine can run them) runs the op suite. ci/smoke-test.sh <wheel>
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: ci/smoke-test.sh <wheel>" >&2; exit 2; }
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
variant=$(cd "$REPO" && "$PYTHON" -c "
import sys
from packaging.utils import parse_wheel_filename
from wheel_index.wheels import variant_of
print(variant_of(parse_wheel_filename(sys.argv[1])[1]))" "$(basename "$wheel")")
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
"$UV" venv -q --python "$PYTHON" "$venv"
torch_source "$variant"
"$UV" pip install -q --python "$venv/bin/python" "$wheel" pytest ${TORCH_SOURCE[@]+"${TORCH_SOURCE[@]}"}
cd "$(dirname "$venv")"
"$venv/bin/python" - "$variant" <<'PY'
import sys
import torch
import engine
variant = sys.argv[1]
info = engine.BUILD_INFO
assert info.variant == variant, (info.variant, variant)
ops = engine.ops.OP_NAMES
key = {"cpu": "CPU"}.get(info.device, "CUDA" if info.device in ("cuda", "rocm") else "XPU")
missing = [op for op in ops if not torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{op}", key)]
assert not missing, f"ops without a {key} kernel: {missing}"
print(f"smoke: vllm-engine {engine.__version__} imports; {len(ops)} ops registered for {key}")
PY
if [ "$variant" = cpu ]; then
  # Every op on every code path this CPU runs, then generation in float32 and
  # bfloat16 (both linear-layer modes) against transformers: a wheel whose bf16
  # path is broken on the builder is never published.
  "$UV" pip install -q --python "$venv/bin/python" "$(grep -E "^transformers" "$REPO/requirements/dev.txt")"
  "$venv/bin/python" -m pytest -q -ra -p no:cacheprovider "$REPO/tests/kernels/test_ops.py" \
    "$REPO/tests/engine/test_engine.py" -k "test_ops or greedy_matches_transformers or bfloat16_generation"
fi
echo "smoke test passed: $(basename "$wheel")"
