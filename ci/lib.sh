# Shared by the ci/ scripts (sourced, not run). Needs $REPO.

# The Python and uv of the development environment (ci/setup-dev.sh) unless
# PYTHON / UV say otherwise.
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
if [ -z "${UV:-}" ]; then
  if [ -x "$(dirname "$PYTHON")/uv" ]; then UV=$(dirname "$PYTHON")/uv; else UV=uv; fi
fi

# Facts about a variant from the variant table (tools/variants.py), as
# "<device> <torch index url or -> <torch pin>".
variant_facts() {
  (cd "$REPO" && "$PYTHON" -c "
import sys
from tools.errors import UserError
from tools.target import torch_requirement
from tools.variants import get_variant
try:
    v = get_variant(sys.argv[1])
except UserError as e:
    sys.exit(f'error: {e}')
print(v.device, v.torch_index_url() or '-', torch_requirement(v))" "$1")
}

# Where the variant's torch comes from, as uv arguments, into the array TORCH_SOURCE:
#   a folder of wheels that holds torch-*+<variant>: $VLLM_TORCH_FIND_LINKS or
#     pip's configured find-links (air-gapped machines like the dev machines);
#   nothing extra when the pin has no local segment (torch==2.13.0 is PyPI's
#     CUDA 13.0 build);
#   else the variant's folder of $VLLM_TORCH_INDEX_BASE (default: PyTorch's index).
# usage: torch_source <variant>
torch_source() {
  local variant=$1 device index_url pin dir
  read -r device index_url pin < <(variant_facts "$variant")
  local candidates="${VLLM_TORCH_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true)"
  for dir in $candidates; do
    if compgen -G "$dir/torch-*+$variant-*.whl" >/dev/null; then
      TORCH_SOURCE=(--find-links "$dir")
      return
    fi
  done
  if [[ "$pin" != *+* ]]; then
    TORCH_SOURCE=()
  else
    TORCH_SOURCE=(--extra-index-url "$index_url")
  fi
}

# The embedded default folder index (the one precompiled mode reads by default).
default_index() {
  (cd "$REPO" && "$PYTHON" -c "from wheel_index.layout import DEFAULT_WHEEL_INDEX; print(DEFAULT_WHEEL_INDEX)")
}
