"""What making a variant wheel costs, against reading the wheel in the same run.

    python benchmarks/variant_wheels.py [--mb 150] [--check]

A synthetic wheel whose extension is --mb MB (half random, half zeros, like a
fat CUDA binary) is turned into its variant wheel; the baseline reads every
member once (inflate + sha256, what RECORD needs anyway). Target: <= 2x, i.e.
the package files are copied, not recompressed. The naive rewrite (recompress
everything) is timed once for comparison.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO / "tests"))

from benchmarks.common import add_record_argument, record  # noqa: E402
from helpers import make_wheel  # noqa: E402
from wheel_index.variant_wheels import make_variant_wheel  # noqa: E402
from wheel_index.wheels import inspect_wheel  # noqa: E402

TARGET = 2.0


def big_wheel(folder: Path, mb: int) -> Path:
    small = make_wheel(folder / "small", "0.1.dev5+gabc1234.cu130", commit="c" * 40)
    out = folder / small.name
    with zipfile.ZipFile(small) as a, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            b.writestr(info, a.read(info))
        half = (mb << 20) // 2
        b.writestr("engine/_C.abi3.so", os.urandom(half) + bytes(half))
    return out


def read_all(path: Path) -> None:
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            h = hashlib.sha256()
            with zf.open(info) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)


def naive_rewrite(path: Path, out: Path) -> None:
    with zipfile.ZipFile(path) as a, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            b.writestr(info, a.read(info))


def median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=150)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    add_record_argument(p)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        src = big_wheel(tmp, args.mb)
        w = inspect_wheel(src)
        out = tmp / "out"
        out.mkdir()
        base = median(lambda: read_all(src), args.repeat)
        conv = median(lambda: make_variant_wheel(w, out), args.repeat)
        t0 = time.perf_counter()
        naive_rewrite(src, tmp / "naive.whl")
        naive = time.perf_counter() - t0
        shutil.rmtree(out)
    ratio = conv / base
    print(f"variant wheel of a {args.mb} MB extension: {conv:.2f} s; reading the wheel "
          f"{base:.2f} s; ratio {ratio:.2f}x (target <= {TARGET}x); recompressing "
          f"everything would take {naive:.2f} s ({naive / base:.1f}x)")
    if args.record:
        record("variant_wheels", [(
            f"variant wheel of a {args.mb} MB extension vs reading the wheel",
            f"{ratio:.2f}x ({conv:.2f} s vs {base:.2f} s; recompressing {naive / base:.1f}x)",
            f"<= {TARGET}x {'met' if ratio <= TARGET else 'missed'}")])
    if args.check and ratio > TARGET:
        print(f"MISSED: variant wheel {ratio:.2f}x the read baseline (target <= {TARGET}x)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
