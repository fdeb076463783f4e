"""Build times of the cpu variant: cold, no-op rebuild, clean rebuild with a
warm compiler cache, each as time and as a ratio to the cold build.

    python benchmarks/build.py [--check]

Builds the committed HEAD in a temporary clone with the development
environment's Python (no build isolation, so only compiling is measured) and
sccache with a private cache directory. Targets: no-op rebuild under 5 s;
clean rebuild with a warm cache under 30% of the cold build.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from benchmarks.common import timed_command as timed  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_check_argument(p)
    args = p.parse_args()
    bindir = Path(sys.executable).parent
    uv = shutil.which("uv", path=str(bindir)) or shutil.which("uv")
    sccache = shutil.which("sccache", path=str(bindir)) or shutil.which("sccache")
    if not uv or not sccache:
        sys.exit("needs uv and sccache (requirements/dev.txt); run ci/setup-dev.sh")
    with tempfile.TemporaryDirectory() as tmp:
        src, cache = Path(tmp) / "src", Path(tmp) / "sccache"
        subprocess.run(["git", "clone", "-q", str(REPO), str(src)], check=True)
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "SCCACHE_DIR": str(cache),
               "PATH": f"{bindir}:{os.environ['PATH']}"}
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
        subprocess.run([sccache, "--start-server"], env=env, check=True, capture_output=True)
        build = [uv, "build", "-q", "--wheel", "--no-build-isolation", "--python", sys.executable,
                 "--out-dir", str(Path(tmp) / "dist"), "."]
        try:
            cold = timed(build, env, src)
            noop = timed(build, env, src)
            shutil.rmtree(src / "build")
            warm = timed(build, env, src)
            stats = subprocess.run([sccache, "--show-stats"], env=env, capture_output=True,
                                   text=True).stdout
        finally:
            subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
    print(f"cpu variant, {os.cpu_count()} cores, sccache")
    print(f"{'build':<38} {'time':>8} {'vs cold':>8} {'target':>10}")
    print(f"{'cold (empty build dir, empty cache)':<38} {cold:7.1f}s {1:7.2f}x {'-':>10}")
    print(f"{'no-op rebuild':<38} {noop:7.1f}s {noop / cold:7.2f}x {'< 5 s':>10}")
    print(f"{'clean rebuild, warm compiler cache':<38} {warm:7.1f}s {warm / cold:7.2f}x "
          f"{'< 0.30x':>10}")
    hits = [line for line in stats.splitlines() if line.startswith(("Cache hits", "Cache misses"))]
    print("\n".join(hits[:2]) + "\n")
    targets = Targets()
    targets.record("no-op rebuild", noop, 5.0, higher_is_better=False, unit="s")
    targets.record("clean rebuild with a warm cache vs cold", warm / cold, 0.30,
                   higher_is_better=False)
    return targets.finish(args.check, record_as="build" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
