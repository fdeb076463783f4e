"""The AArch64 kernels without torch: tests/native/kernel_check.cpp links the
kernel objects exactly as the extension compiles them (cmake/cpu_arm.cmake) and
checks every op, float32 and bfloat16, of every table (neon, neon_bf16 and the
portable generic one) against a double-precision reference. On x86_64 it is
cross-compiled and run under qemu-aarch64 (seconds); on aarch64, natively."""
from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import REPO, run  # noqa: E402

pytestmark = [pytest.mark.aarch64, pytest.mark.slow]

NATIVE = platform.machine() == "aarch64"
SETUP = "run 'bash ci/setup-aarch64.sh' (as root) first"


def _prerequisites() -> str | None:
    if NATIVE:
        return None if shutil.which("g++") else "no g++ on this aarch64 machine"
    missing = [p for p in ("aarch64-linux-gnu-g++", "qemu-aarch64-static") if not shutil.which(p)]
    return f"{', '.join(missing)} not installed; {SETUP}" if missing else None


@pytest.fixture(scope="module")
def kernel_check(tmp_path_factory) -> list[str]:
    """The built driver, as the command that runs it."""
    reason = _prerequisites()
    if reason:
        pytest.skip(reason)
    build = tmp_path_factory.mktemp("kernel-check")
    cmake = [sys.executable, "-c", "import cmake, sys; sys.exit(cmake.cmake())"]
    args = [] if NATIVE else [f"-DCMAKE_TOOLCHAIN_FILE={REPO}/cmake/toolchain-aarch64-linux-gnu.cmake"]
    run([*cmake, "-S", REPO / "tests" / "native", "-B", build, "-G", "Ninja",
         f"-DCMAKE_MAKE_PROGRAM={shutil.which('ninja') or Path(sys.executable).with_name('ninja')}",
         *args])
    run([*cmake, "--build", build])
    exe = str(build / "kernel_check")
    return [exe] if NATIVE else ["qemu-aarch64-static", exe]


def test_every_op_of_every_table_matches_the_reference(kernel_check):
    proc = run([*kernel_check], check=False, env={"OMP_NUM_THREADS": "2"})
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failed, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    # neon and generic always run; neon_bf16 where the CPU has BF16 (qemu's does)
    assert summary.endswith(" 0 failed") and "on 3 kernel tables" in summary, summary
    for isa in ("neon", "neon_bf16", "generic"):
        for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding",
                   "reshape_and_cache", "paged_attention", "lora_add"):
            for dt in ("fp32", "bf16"):
                assert any(line.split()[1:4] == [isa, op, dt] for line in proc.stdout.splitlines()), \
                    f"{isa} {op} {dt} was not checked"
        # GGUF's int8 product: both NEON tables (SDOT on neon_bf16), none on generic
        checked = {line.split()[3] for line in proc.stdout.splitlines()
                   if line.split()[1:3] == [isa, "gguf_int8_linear"]}
        assert checked == (set() if isa == "generic" else {"fp32", "bf16"}), (isa, checked)


def test_a_table_the_cpu_lacks_is_refused(kernel_check):
    # asking for a table by a name that is not compiled in runs nothing: failure
    proc = run([*kernel_check, "sve2"], check=False)
    assert proc.returncode != 0 and "on 0 kernel tables" in proc.stdout
