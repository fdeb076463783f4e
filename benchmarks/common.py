"""Timing helpers shared by the benchmarks: medians of repeated runs, ratios
against a baseline measured in the same process (these machines are noisy)."""
from __future__ import annotations

import atexit
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
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

    def result_rows(self) -> list[tuple[str, str, str]]:
        """(measure, result, target) per row, for record()."""
        return [(name, self._fmt(value, unit),
                 f"{'>=' if hib else '<='} {self._fmt(target, unit)}"
                 f" {'met' if self._ok(value, target, hib) else 'missed'}")
                for name, value, target, hib, unit in self.rows]

    def finish(self, check: bool, record_as: str | None = None) -> int:
        """Print the table; with record_as, write it to RESULTS.md under that benchmark's
        name (record()); with check, exit 1 naming every missed target. Returns 0."""
        print(self.table())
        if record_as:
            record(record_as, self.result_rows())
        missed = self.missed()
        if check and missed:
            raise SystemExit("missed target(s): " + "; ".join(missed))
        return 0


def add_check_argument(parser) -> None:
    """The `--check` and `--record` flags every benchmark takes (argparse)."""
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming each missed target (for CI)")
    add_record_argument(parser)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A /proc/<pid>/status memory field (VmRSS, VmHWM, ...) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def process_tree(pid: int) -> list[int]:
    """pid and every live descendant (vLLM runs its engine core in a child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


#: every loaded side of a comparison (a Worker, serve.py's servers): the sides
#: not taking their turn are stopped (SIGSTOP), see take_turn
_SIDES: list = []


def take_turn(side) -> None:
    """Stop every other loaded side's process tree and continue `side`'s
    (anything with a `proc`), before it runs. An idle engine is not always
    still: upstream vLLM's worker polls its shared-memory queue, and on 2
    cores each wake-up preempts the measured engine's threads (one run: our
    500-token SmolLM-shape prefill 595 -> 641 ms beside an idle `LLM` of vLLM
    0.32.0, though this machine's speed also swings by that much). Stopped,
    a side costs the measured one nothing, whichever side it is."""
    for other in _SIDES:
        if other is not side:
            signal_tree(other.proc.pid, signal.SIGSTOP)
    signal_tree(side.proc.pid, signal.SIGCONT)


def join_turns(side) -> None:
    """`side` is loaded: from now on it is stopped while another runs."""
    _SIDES.append(side)


def leave_turns(side) -> None:
    """Continue `side` (to close it) and no longer stop it."""
    if side in _SIDES:
        _SIDES.remove(side)
    signal_tree(side.proc.pid, signal.SIGCONT)


@atexit.register
def _continue_all() -> None:
    """A benchmark that ends on an error never leaves a side stopped."""
    for side in list(_SIDES):
        leave_turns(side)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used, its threads' included; 0 once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def signal_tree(pid: int, sig: int) -> None:
    for p in process_tree(pid):
        try:
            os.kill(p, sig)
        except OSError:  # gone meanwhile
            pass


class PeakRss:
    """The peak of a process tree's summed RSS in MiB, sampled every
    `interval` s from a thread until stop(). (getrusage's ru_maxrss would count
    the memory a child had before exec, which is this process's, and not a
    grandchild's.)"""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.peak = pid, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
        self._thread.start()

    def _sample(self, interval: float) -> None:
        while not self._done.wait(interval):
            total = 0.0
            for p in process_tree(self.pid):
                try:
                    total += rss_mb(p)
                except (OSError, StopIteration):
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return self.peak


def say_ready(info: dict | None = None) -> None:
    """A child's READY line, once the engine in this process (if any) has
    committed its KV cache: the thread that faults it in after start-up
    (engine/worker/model_runner.py) would otherwise take CPU from the first
    timed runs, or, stopped while another side takes its turn, from later ones."""
    runner = sys.modules.get("engine.worker.model_runner")
    for t in threading.enumerate() if runner is not None else ():
        if t.name == runner.KV_COMMIT_THREAD:
            t.join()
    print("READY " + json.dumps(info or {}), flush=True)


class Worker:
    """A benchmark's child process that loads once and then answers requests:
    it prints "READY <json>" when loaded, then one "RESULT <json>" per line it
    reads from stdin. Other lines it prints are skipped (a peer prints its own);
    its stderr goes to `log`, shown when it dies. With rss_interval, the peak
    RSS of its process tree is sampled (PeakRss) until close()."""

    def __init__(self, cmd: list[str], env, log, what: str,
                 rss_interval: float | None = None):
        self.what, self.log_path = what, log
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.rss = PeakRss(self.proc.pid, rss_interval) if rss_interval else None
        self.ready = self._answer("READY ")
        join_turns(self)

    def _answer(self, tag: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith(tag):
                return json.loads(line[len(tag):])
        self.log.flush()
        sys.exit(f"the {self.what} exited {self.proc.wait()}; see {self.log_path}:\n"
                 f"{Path(self.log_path).read_text()[-3000:]}")

    def ask(self, request: str) -> dict:
        take_turn(self)
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return self._answer("RESULT ")

    def close(self) -> None:
        leave_turns(self)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.rss is not None:
            self.rss.stop()
        self.log.close()


class BestOfWorker(Worker):
    """A Worker whose answers ({"tokens", "seconds", ...}) are kept per request,
    the fastest of the rounds run: `name` labels its side of a comparison."""

    def __init__(self, cmd: list[str], env, log, name: str,
                 rss_interval: float | None = None):
        super().__init__(cmd, env, log, f"{name} run", rss_interval)
        self.name, self.best = name, {}

    def run(self, request: str) -> None:
        r = self.ask(request)
        if request not in self.best or r["seconds"] < self.best[request]["seconds"]:
            self.best[request] = r

    def rate(self, request: str) -> float:
        return self.best[request]["tokens"] / self.best[request]["seconds"]


# --- benchmarks/RESULTS.md: the one file measured figures live in ----------

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_COLUMNS = ("measure", "result", "target", "machine", "date")
_PREAMBLE = """# Benchmark results

Written by the benchmarks, never by hand: `python benchmarks/<name>.py --record` replaces
that benchmark's rows measured on the same machine and keeps every other machine's. Each
row names its machine (CPU model from `/proc/cpuinfo`, the CPU code path the kernels use,
CPU count) and the day it was measured. Each ratio is against a baseline measured in the
same run; `--check` turns a missed target into exit 1. A benchmark that has not been run
with `--record` yet has no section; the file fills as they run.
"""


def add_record_argument(parser) -> None:
    """The `--record` flag every benchmark takes (argparse); off by default, so test runs
    never rewrite RESULTS.md."""
    parser.add_argument("--record", action="store_true",
                        help="write this run's figures into benchmarks/RESULTS.md")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name ("model name" on x86; else the architecture)."""
    import platform

    try:
        for line in cpuinfo.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def kernel_isa() -> str:
    """The CPU code path the kernels use: the one loaded in this process when the
    benchmark imported engine.ops, else what VLLM_CPU_ISA or `auto` picks on this CPU."""
    ops = sys.modules.get("engine.ops")
    if ops is not None:
        try:
            isa = ops.cpu_isa()
            if isa:
                return isa
        except Exception:  # no CPU kernels in this build: fall back to the probe
            pass
    try:
        from engine.envs import cpu_isa
        from engine.platforms.cpu_features import current
    except ImportError:
        return "unknown"
    requested = cpu_isa()
    if requested != "auto":
        return requested
    usable = current().usable_isas()
    return usable[0] if usable else "generic"


def machine() -> str:
    """One line naming this machine: CPU model, kernel code path, CPU count."""
    return f"{cpu_model()} ({kernel_isa()}, {os.cpu_count()} CPUs)"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _cells(line: str) -> list[str]:
    import re

    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _parse(text: str) -> tuple[str, dict[str, list[list[str]]]]:
    """RESULTS.md as (preamble, {benchmark: rows}); rows are lists of escaped cells."""
    preamble, sections, current = [], {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is None:
            preamble.append(line)
        elif line.startswith("|") and not line.startswith("|---"):
            cells = _cells(line)
            if len(cells) == len(_COLUMNS) and cells != list(_COLUMNS):
                current.append(cells)
    return "\n".join(preamble).strip() + "\n", sections


def _render(preamble: str, sections: dict[str, list[list[str]]]) -> str:
    out = [preamble]
    for name, rows in sections.items():
        out += [f"## {name}", "", "| " + " | ".join(_COLUMNS) + " |",
                "|" + "---|" * len(_COLUMNS)]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        out.append("")
    return "\n".join(out)


def record(benchmark: str, rows, *, path: Path | None = None, machine_name: str | None = None,
           day: str | None = None) -> Path:
    """Upsert `benchmark`'s rows, each (measure, result, target), into RESULTS.md: a row
    with the same measure and machine is replaced, every other row kept. The file is
    rewritten whole through a temporary file and os.replace, under a lock on its folder,
    so a reader never sees half of it and two benchmarks recording at once lose nothing."""
    import datetime
    import fcntl
    import tempfile

    path = Path(path or RESULTS)
    where = _cell(machine_name or machine())
    day = day or datetime.date.today().isoformat()
    new = [[_cell(measure), _cell(result), _cell(target), where, day]
           for measure, result, target in rows]
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        preamble, sections = (_parse(path.read_text()) if path.exists()
                              else (_PREAMBLE, {}))
        replaced = {(r[0], r[3]) for r in new}
        kept = [r for r in sections.get(benchmark, []) if (r[0], r[3]) not in replaced]
        merged = kept + new
        # a machine's rows together, in the order they were measured
        machines = list(dict.fromkeys(r[3] for r in merged))
        sections[benchmark] = sorted(merged, key=lambda r: machines.index(r[3]))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".RESULTS.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(_render(preamble, sections))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    finally:
        os.close(folder)
    print(f"recorded {len(new)} row(s) under '{benchmark}' in {path}")
    return path
