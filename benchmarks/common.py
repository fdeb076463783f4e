"""Timing helpers shared by the benchmarks: medians of repeated runs, ratios
against a baseline measured in the same process (these machines are noisy)."""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Callable


def median_time(fn: Callable[[], object], *, repeat: int = 7, min_time: float = 0.05) -> float:
    """Median seconds per call; each sample loops until it lasts min_time."""
    fn()  # warm-up
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time:
            break
        n *= 2
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def timed_command(cmd, env=None, cwd=None) -> float:
    """Seconds one command takes; a failure ends the benchmark with its output."""
    t0 = time.perf_counter()
    res = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return dt


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:8.2f} {unit}"
    return f"{seconds * 1e9:8.0f} ns"


class Targets:
    """Each benchmark's targets, checked in one place so that `--check` can gate CI.

        targets = Targets()
        targets.record("no-op rebuild", noop, 5.0, higher_is_better=False, unit="s")
        targets.record("rms_norm fp32 vs eager", speedup, 2.0)          # a ratio, higher is better
        return targets.finish(args.check)

    finish() prints the table; with check=True a missed target exits 1 naming it
    (without --check the numbers are informative and the run exits 0).
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, bool, str]] = []

    def record(self, name: str, value: float, target: float, *, higher_is_better: bool = True,
               unit: str = "x") -> bool:
        self.rows.append((name, value, target, higher_is_better, unit))
        return self._ok(value, target, higher_is_better)

    @staticmethod
    def _ok(value: float, target: float, higher_is_better: bool) -> bool:
        return value >= target if higher_is_better else value <= target

    @staticmethod
    def _fmt(value: float, unit: str) -> str:
        return f"{value:.3g}{unit}" if unit in ("x", "s", "") else f"{value:.3g} {unit}"

    def missed(self) -> list[str]:
        return [f"{name}: {self._fmt(value, unit)}, target {'>=' if hib else '<='} "
                f"{self._fmt(target, unit)}"
                for name, value, target, hib, unit in self.rows
                if not self._ok(value, target, hib)]

    def table(self) -> str:
        width = max([len(r[0]) for r in self.rows] + [6])
        lines = [f"{'target':<{width}} {'value':>10} {'goal':>12}  result"]
        for name, value, target, hib, unit in self.rows:
            goal = f"{'>=' if hib else '<='} {self._fmt(target, unit)}"
            ok = "ok" if self._ok(value, target, hib) else "MISS"
            lines.append(f"{name:<{width}} {self._fmt(value, unit):>10} {goal:>12}  {ok}")
        return "\n".join(lines)

    def finish(self, check: bool) -> int:
        """Print the table; with check, exit 1 naming every missed target. Returns 0."""
        print(self.table())
        missed = self.missed()
        if check and missed:
            raise SystemExit("missed target(s): " + "; ".join(missed))
        return 0


def add_check_argument(parser) -> None:
    """The `--check` flag every benchmark takes (argparse)."""
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming each missed target (for CI)")
