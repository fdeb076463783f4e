# Cross builds for ci/build-wheel.sh --arch (sourced, not run). Needs $REPO,
# $UV, $PYTHON (ci/lib.sh). Only aarch64 on x86_64 hosts, cpu variant.
#
# The target's torch is unpacked (never installed into a host environment)
# from PyPI's aarch64 wheel of the variant's torch version: its headers and
# libraries are what the extension compiles and links against. PyPI's aarch64
# torch is a CUDA build, but the extension uses only libtorch_cpu and c10,
# whose API is the same as in the +cpu build the wheel pins at run time.

# The cache of everything aarch64 (ci/setup-aarch64.sh fills the rest).
AARCH64_CACHE=${VLLM_AARCH64_CACHE:-/var/cache/vllm-engine/aarch64}
# The Python of the aarch64 test environment (Debian bookworm's): the torch
# headers and libraries do not depend on it, only the wheel's file name does.
AARCH64_PYTHON_VERSION=3.11

# usage: cross_check <arch> <variant>: exits with one line when it cannot work.
cross_check() {
  local arch=$1 variant=$2
  case "$(uname -m)->$arch" in
    x86_64-\>aarch64) ;;
    *) echo "error: cannot cross-build for $arch on $(uname -m); supported: aarch64 on x86_64" \
            "(or run the same command on a $arch machine)" >&2; exit 2 ;;
  esac
  if [ "$variant" != cpu ]; then
    echo "error: --arch $arch cross-builds the cpu variant only (asked: $variant)" >&2; exit 2
  fi
  command -v aarch64-linux-gnu-g++ >/dev/null || {
    echo "error: aarch64-linux-gnu-g++ is not installed; run 'bash ci/setup-aarch64.sh'" \
         "(or apt-get install g++-aarch64-linux-gnu)" >&2; exit 2; }
}

# usage: cross_prepare <arch> <variant> <venv>; sets CROSS_SETTINGS (uv build
# arguments) and exports _PYTHON_HOST_PLATFORM (scikit-build-core's wheel tag).
cross_prepare() {
  local arch=$1 variant=$2 venv=$3 pin
  read -r _ _ pin < <(variant_facts "$variant")
  pin=${pin%%;*}
  pin=${pin%%+*}  # PyPI's aarch64 build carries no local label
  echo "==> torch for aarch64 ($pin, PyPI's manylinux_2_28_aarch64 wheel, unpacked into $venv/target)"
  UV_CACHE_DIR=${UV_CACHE_DIR:-$AARCH64_CACHE/uv-cache} "$UV" pip install -q --no-deps \
    --python-platform aarch64-manylinux_2_28 --python-version "$AARCH64_PYTHON_VERSION" \
    --target "$venv/target" "$pin"
  CROSS_SETTINGS=(-C "cmake.define.CMAKE_TOOLCHAIN_FILE=$REPO/cmake/toolchain-aarch64-linux-gnu.cmake"
                  -C "cmake.define.VLLM_TORCH_ROOT=$venv/target/torch"
                  -C "build-dir=build/$variant-$arch")
  export _PYTHON_HOST_PLATFORM=linux-$arch
}
