#!/usr/bin/env bash
# Install upstream vLLM's CPU engine (the benchmarks' peer) into its own venv
# (benchmarks/peer.py says where and which version). Its torch pin is the
# engine's (torch==2.13.0+cpu), taken from the same folder of wheels; an
# --override file gives torchvision/torchaudio/torchcodec a never-true marker
# so that PyPI's CUDA torch is never dragged in. Safe to run again.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
source "$REPO/ci/lib.sh"
peer() { (cd "$REPO" && "$PYTHON" -m benchmarks.peer "$@"); }
VENV=$(peer venv)
REQ=$(peer requirement)
read -r _ _ TORCH_PIN < <(variant_facts cpu)
torch_source cpu
OVERRIDES=$(mktemp)
trap 'rm -f "$OVERRIDES"' EXIT
{
  echo "$TORCH_PIN"
  for name in $(peer never); do echo "$name; sys_platform == 'never'"; done
} > "$OVERRIDES"
if [ ! -x "$VENV/bin/python" ]; then
  "$UV" venv -q --python "$("$PYTHON" -c 'import sys; print(sys.executable)')" "$VENV"
fi
"$UV" pip install -q --python "$VENV/bin/python" "$REQ" --override "$OVERRIDES" \
  "${TORCH_SOURCE[@]}" --index-strategy unsafe-best-match
"$VENV/bin/python" -c "import torch, vllm; print('peer ready: vllm', vllm.__version__, 'torch', torch.__version__)"
