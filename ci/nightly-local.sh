#!/usr/bin/env bash
# Run the nightly pipeline on this machine, for the variants it can build:
# cpu always; cu130 when nvcc is here and it is asked for (--variants cpu,cu130)
# or its build environment already holds a CUDA torch. Publishes into the
# embedded default folder index (or --index DIR|s3://...), then installs the
# result into a fresh virtual environment with the contract's uv command and
# smoke-tests it.
#   ci/nightly-local.sh [--index INDEX] [--variants cpu,cu130] [--allow-dirty] [--force]
# Runs any number of times on one commit: its wheels rebuild byte-identical, and
# publishing identical bytes is a no-op (--force replaces wheels that differ).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ] && [ ! -x "$REPO/.venv/bin/python" ]; then bash "$REPO/ci/setup-dev.sh"; fi
source "$REPO/ci/lib.sh"
index=$(default_index)
variants=""
allow_dirty=0
publish_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --index) index=$2; shift 2 ;;
    --variants) variants=${2//,/ }; shift 2 ;;
    --allow-dirty) allow_dirty=1; shift ;;
    --force) publish_args+=(--force); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$variants" ]; then
  variants=cpu
  if command -v nvcc >/dev/null && [ -x "$REPO/.venvs/build-cu130/bin/python" ] &&
     "$REPO/.venvs/build-cu130/bin/python" -c "import torch, sys; sys.exit(not torch.version.cuda)" 2>/dev/null; then
    variants="cpu cu130"
  fi
fi
if [ $allow_dirty = 0 ] && [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]; then
  echo "error: the working tree has uncommitted changes; wheels are published under a commit," \
       "so commit first (or pass --allow-dirty)" >&2
  exit 1
fi
echo "==> nightly for $(git -C "$REPO" rev-parse --short HEAD): variants [$variants] -> $index"
for v in $variants; do
  bash "$REPO/ci/pipeline.sh" "$v" --index "$index" ${publish_args[@]+"${publish_args[@]}"}
done

echo "==> installing from the index into a fresh environment"
check=$(mktemp -d)
cleanup() { [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null; rm -rf "$check"; }
trap cleanup EXIT
case "$index" in
  s3://*) echo "(published to $index; install from its HTTP endpoint or CDN)"; exit 0 ;;
esac
port=$("$PYTHON" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
(cd "$REPO" && exec "$PYTHON" -m wheel_index serve --index "$index" --port "$port") >/dev/null &
server_pid=$!
for _ in $(seq 50); do
  # any HTTP answer (even 404 for /) means the server is up
  "$PYTHON" -c "
import urllib.error, urllib.request
try:
    urllib.request.urlopen('http://127.0.0.1:$port/')
except urllib.error.HTTPError:
    pass" 2>/dev/null && break
  sleep 0.2
done
"$UV" venv -q --python "$PYTHON" "$check/venv"
torch_source cpu
url=http://127.0.0.1:$port
# ci/publish.sh moves nightly only for a commit on main; elsewhere check the commit's own folder.
folder=nightly
if [ "$(git -C "$REPO" rev-parse --abbrev-ref HEAD)" != main ]; then
  folder=$(git -C "$REPO" rev-parse HEAD)
fi
echo "contract: uv pip install vllm-engine --extra-index-url $url/$folder/cpu --index-strategy first-index --torch-backend cpu"
if [ "${TORCH_SOURCE[0]:-}" = --find-links ]; then
  # PyTorch's index is not reachable from here: take torch from where ci/lib.sh found it.
  torch_args=("${TORCH_SOURCE[@]}")
elif [ -n "${VLLM_TORCH_INDEX_BASE:-}" ]; then
  torch_args=("${TORCH_SOURCE[@]}")
else
  torch_args=(--torch-backend cpu)
fi
"$UV" pip install -q --python "$check/venv/bin/python" vllm-engine --extra-index-url "$url/$folder/cpu" \
  --index-strategy first-index "${torch_args[@]}"
(cd "$check" && "$check/venv/bin/python" -c "
import torch, engine
x = torch.randn(4, 64); out = torch.empty_like(x)
engine.ops.rms_norm(out, x, torch.ones(64), 1e-6)
print('installed from the index and ran:', engine.__version__, engine.BUILD_INFO.variant, engine.ops.cpu_isa())")
echo "==> done; the index server is stopped. To serve this index again and install from it:"
echo "  (cd $REPO && $PYTHON -m wheel_index serve --index $index --port 8000)"
echo "  $UV pip install vllm-engine --extra-index-url http://127.0.0.1:8000/$folder/cpu --index-strategy first-index --torch-backend cpu"
