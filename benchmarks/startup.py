"""How fast the command-line entry points answer, against `python -c pass`.

    python benchmarks/startup.py [--repeat 7] [--check]

Each command runs in a fresh process with this environment's Python; the time
is until its first line of output (then it is stopped), the median of
--repeat runs. None of them may import torch before that line.
Target: each under 5x the bare interpreter's start.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.common import Targets, add_check_argument  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
ENGINE = [str(Path(PY).with_name("engine"))] if Path(PY).with_name("engine").exists() else \
    [PY, "-m", "engine.cli"]
COMMANDS = {
    "engine --help": ENGINE + ["--help"],
    "engine env (first line)": ENGINE + ["env"],
    "python -m tools.target": [PY, "-m", "tools.target"],
}


def first_line(cmd: list[str]) -> float:
    """Seconds until the command prints its first line (or exits)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdout.readline()
    dt = time.perf_counter() - t0
    proc.kill()
    proc.wait()
    proc.stdout.close()
    return dt


def median(cmd: list[str], repeat: int) -> float:
    first_line(cmd)  # warm the file cache
    return statistics.median(first_line(cmd) for _ in range(repeat))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    add_check_argument(p)
    args = p.parse_args()
    base = median([PY, "-c", "print()"], args.repeat)
    print(f"{'python -c pass':<26} {base * 1e3:7.1f} ms   1.00x")
    targets = Targets()
    for name, cmd in COMMANDS.items():
        t = median(cmd, args.repeat)
        print(f"{name:<26} {t * 1e3:7.1f} ms  {t / base:5.2f}x")
        targets.record(f"{name} vs python -c pass", t / base, 5.0, higher_is_better=False)
    print()
    return targets.finish(args.check, record_as="startup" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
