#!/usr/bin/env bash
# The GPU check: on a machine with one NVIDIA GPU, from a fresh clone, in a few
# minutes. Builds the cu130 variant for this GPU's architecture only, then runs
# (python -m tools.gpu_check) every CUDA op against engine.reference (float32
# and bfloat16, odd shapes, GQA, strided views, bound checks), the engine's
# greedy output against transformers on CUDA, and the kernels against eager
# torch on CUDA (--check: a slower kernel fails the run, naming it).
#
#   bash ci/gpu-check.sh            # exit 0: all passed
#
# Needs nvidia-smi, nvcc (CUDA 13 toolkit), python3 and the network (or
# VLLM_TORCH_FIND_LINKS, see ci/lib.sh) for the CUDA torch.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ' || true)
if [[ ! "$cap" =~ ^[0-9]+\.[0-9]+$ ]]; then
  echo "error: no NVIDIA GPU here (nvidia-smi reports none); ci/gpu-check.sh needs a machine with one" >&2
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null ||
  { echo "error: nvcc not found; install the CUDA 13 toolkit (or put it on PATH)" >&2; exit 1; }
echo "==> $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1), compute capability $cap"
start=$SECONDS

venv=$REPO/.venvs/gpu-check
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# uv and transformers at their pins (requirements/ci.txt, requirements/dev.txt)
pin() { grep -hE "^$1([<>=! ;]|$)" "$REPO/requirements/ci.txt" "$REPO/requirements/dev.txt" | head -n 1; }
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$(pin uv)" "packaging>=23"
PYTHON=$venv/bin/python
UV=$venv/bin/uv
source "$REPO/ci/lib.sh"
torch_source cu130
echo "==> CUDA torch and build requirements ($((SECONDS - start)) s)"
"$UV" pip install -q --python "$PYTHON" -r requirements/build/cu130.txt -r requirements/cu130.txt \
  "$(pin transformers)" ${TORCH_SOURCE[@]+"${TORCH_SOURCE[@]}"}

echo "==> building cu130 for sm_${cap/./} only ($((SECONDS - start)) s)"
VLLM_TARGET_DEVICE=cuda TORCH_CUDA_ARCH_LIST=$cap \
  "$UV" pip install -q --python "$PYTHON" --no-build-isolation -e .

echo "==> ops, greedy output, kernels vs eager torch ($((SECONDS - start)) s)"
"$PYTHON" -m tools.gpu_check --device cuda --check
echo "==> GPU check passed in $((SECONDS - start)) s"
