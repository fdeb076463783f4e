#!/usr/bin/env bash
# Set up what the aarch64 tests need on an x86_64 Debian machine, as root:
#   * the cross compiler (g++-aarch64-linux-gnu) and user-mode qemu with its
#     binfmt_misc handler (so the chroot below runs aarch64 programs);
#   * an arm64 Debian bookworm root file system (debootstrap) whose Python 3.11
#     holds torch==<the cpu variant's version> from PyPI (a CUDA 13 build: its
#     nvidia-* aarch64 packages come along, several GB), pytest, transformers
#     and the runtime requirements (requirements/common.txt); the engine's own
#     wheel is installed by the tests, into a fresh venv each run.
# Everything is kept under $VLLM_AARCH64_CACHE (default /var/cache/vllm-engine/
# aarch64). Safe to run again: each step is skipped when its stamp matches, so
# a second run takes seconds. On an aarch64 machine nothing is emulated: it only
# says so.
#
# Packages are installed into the root file system by the host's uv for the
# aarch64 platform: the same wheels pip would pick there, at native speed.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
source "$REPO/ci/cross.sh"
source "$REPO/ci/debian-lib.sh"
uv=$UV
cache=$AARCH64_CACHE
rootfs=$cache/rootfs
start=$(date +%s)
say() { echo "==> [aarch64 $(($(date +%s) - start))s] $*"; }

if [ "$(uname -m)" = aarch64 ]; then
  say "this is an aarch64 machine: nothing to emulate; ci/build-wheel.sh builds natively"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "error: ci/setup-aarch64.sh needs root (apt-get, mount, chroot)" >&2; exit 2; }
command -v "$uv" >/dev/null || { echo "error: uv is not installed (run ci/setup-dev.sh first)" >&2; exit 2; }
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one set-up at a time on this machine

# 1. host packages
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v update-binfmts >/dev/null || need+=(binfmt-support)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. binfmt_misc: the kernel hands aarch64 ELF files to qemu (needed by chroot)
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
if ! grep -qs '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 ||
    update-binfmts --import qemu-aarch64 >/dev/null
fi
grep -qs '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 ||
  { echo "error: could not register qemu-aarch64 with binfmt_misc" >&2; exit 1; }

# 3. the root file system (no network or certificates needed inside: packages
#    are installed from outside)
if [ ! -f "$rootfs/.vllm-rootfs-ready" ]; then
  say "debootstrap arm64 bookworm into $rootfs (about 3-5 minutes)"
  rm -rf "$rootfs.tmp"
  mirror=$(host_debian_mirror)  # this host's apt mirror (ci/debian-lib.sh)
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv \
    bookworm "$rootfs.tmp" ${mirror:+"$mirror"} >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log" >&2; echo "error: debootstrap failed (log: $cache/debootstrap.log)" >&2; exit 1; }
  rm -rf "$rootfs"
  mv "$rootfs.tmp" "$rootfs"
  touch "$rootfs/.vllm-rootfs-ready"
fi
pyver=$(chroot "$rootfs" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$pyver" = "$AARCH64_PYTHON_VERSION" ] ||
  { echo "error: the rootfs has Python $pyver, ci/cross.sh expects $AARCH64_PYTHON_VERSION" >&2; exit 1; }

# 4. Python packages, into the rootfs' /usr/local site (a venv created with
#    --system-site-packages sees them). The stamp is the list asked for.
read -r _ _ pin < <(variant_facts cpu)
pin=${pin%%;*}
pin=${pin%%+*}
wanted=("$pin" -r "$REPO/requirements/common.txt"
        "$(grep -E '^pytest([<>=!~ ]|$)' "$REPO/requirements/dev.txt")"
        "$(grep -E '^transformers([<>=!~ ]|$)' "$REPO/requirements/dev.txt")")
stamp="$(printf '%s\n' "${wanted[@]}"; cat "$REPO/requirements/common.txt")"
site=$rootfs/usr/local/lib/python$pyver/dist-packages
if [ "$(cat "$rootfs/.vllm-packages" 2>/dev/null)" != "$stamp" ]; then
  say "installing ${wanted[*]} for aarch64 (torch and its nvidia-* packages: ~3.5 GB to download once)"
  mkdir -p "$site"
  UV_CACHE_DIR=${UV_CACHE_DIR:-$cache/uv-cache} "$uv" pip install -q \
    --python-platform aarch64-manylinux_2_28 --python-version "$pyver" --target "$site" "${wanted[@]}"
  printf '%s' "$stamp" >"$rootfs/.vllm-packages"
fi

# 5. mounts and the description of the emulated CPU (see ci/aarch64-mounts.sh)
bash "$REPO/ci/aarch64-mounts.sh"

# 6. the check, once per package set (it costs ~45 CPU-seconds under qemu):
#    aarch64 Python imports torch, and torch's GEMM gives right numbers
if [ "$(cat "$rootfs/.vllm-checked" 2>/dev/null)" != "$stamp" ]; then
  say "checking: import torch under qemu (about a minute)"
  chroot "$rootfs" /usr/bin/python3 -c \
    'import platform, torch; x = torch.randn(8, 64); w = torch.randn(32, 64)
err = (x @ w.T - (x.double() @ w.double().T).float()).abs().max().item()
assert err < 1e-4, f"torch matmul is wrong under qemu (max error {err}): check ci/aarch64-mounts.sh"
print("aarch64 ready:", platform.machine(), "python", platform.python_version(), "torch", torch.__version__)'
  printf '%s' "$stamp" >"$rootfs/.vllm-checked"
fi
say "done (cache: $cache)"
