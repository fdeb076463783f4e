#!/usr/bin/env bash
# What chroot'ed aarch64 programs need from the kernel, for the root file
# system ci/setup-aarch64.sh made; mounts do not survive a reboot, so both
# that script and tests/toolchain/test_aarch64.py call this (idempotent, as root).
#
# qemu-user (Debian 12's 7.2) passes the x86 host's /proc/cpuinfo through and
# emulates no /sys. torch's cpuinfo then fails to initialize, and with it
# torch's aarch64 GEMM silently returns wrong numbers (seen: F.linear off by
# 19 on random data) and float16 conversions raise. So the chroot gets a
# description of the CPU qemu emulates (its "max" model: Armv8.x with BF16,
# described as two Neoverse-V1 cores): /proc/cpuinfo bind-mounted over the
# host's, and /sys/devices/system/cpu as plain files.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/cross.sh"
rootfs=$AARCH64_CACHE/rootfs
[ -d "$rootfs/proc" ] || { echo "error: no root file system at $rootfs; run 'bash ci/setup-aarch64.sh'" >&2; exit 2; }
mountpoint -q "$rootfs/proc" || mount -t proc proc "$rootfs/proc"
mountpoint -q "$rootfs/dev" || mount --bind /dev "$rootfs/dev"
mkdir -p "$rootfs/tmp" && chmod 1777 "$rootfs/tmp"
# benchmarks/kernels.py marks its ratios as emulated when it finds this
mkdir -p "$rootfs/etc/vllm-engine"
echo "qemu-user on $(uname -m) (ci/aarch64-mounts.sh)" >"$rootfs/etc/vllm-engine/emulated"

cpus=2
features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb dcpodp flagm2 frint i8mm bf16"
cpuinfo=$AARCH64_CACHE/cpuinfo
: >"$cpuinfo.tmp"
for ((i = 0; i < cpus; i++)); do
  printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd40\nCPU revision\t: 1\n\n' \
    "$i" "$features" >>"$cpuinfo.tmp"
done
mv "$cpuinfo.tmp" "$cpuinfo"
sys=$rootfs/sys/devices/system/cpu
mountpoint -q "$rootfs/sys" && umount "$rootfs/sys"  # never the host's sysfs: cpuinfo crashes on it
mkdir -p "$sys"
for f in possible present online; do echo "0-$((cpus - 1))" >"$sys/$f"; done
for ((i = 0; i < cpus; i++)); do
  mkdir -p "$sys/cpu$i/regs/identification"
  echo 0x00000000410fd401 >"$sys/cpu$i/regs/identification/midr_el1"
done
mountpoint -q "$rootfs/proc/cpuinfo" || mount --bind "$cpuinfo" "$rootfs/proc/cpuinfo"
