"""How OpenMP threads wait between parallel regions, chosen before torch loads.

libgomp's default is to spin for a while at every barrier. That is right on
cores the engine has to itself, and a collapse on shared ones: a thread whose
core is taken by another process is descheduled mid-region, and every other
thread spins through its time slice waiting for it. Measured on 2 shared
cores (docs/shared-cores.md), 1-request decode fell to a few tokens/s with
the default and held ~60 with OMP_WAIT_POLICY=PASSIVE (threads sleep at a
barrier). So when other work already keeps the allowed CPUs busy as the
engine starts, the engine asks for PASSIVE. Busy means now, not a minute ago:
on quiet cores PASSIVE halves decode (a 2-core Xeon, small fp32 Llama, 1
request 207 -> 92 tok/s) and slows prefill 10%, and the load average still
counts work that has just ended (a benchmark's previous engine), so a high
load is confirmed by the runnable tasks of this instant. An OMP_WAIT_POLICY or
GOMP_SPINCOUNT that is set is never changed. libgomp reads these when it
loads, with torch: a process that imported torch before the engine keeps
what it had. (Not under engine/platforms/: that package imports torch.)
"""
from __future__ import annotations

import os
import sys
import time
from typing import Mapping, MutableMapping

#: other work, in CPUs kept busy on average, at which the allowed CPUs count as shared
BUSY_CPUS = 0.5


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def running_others(samples: int = 5, gap_s: float = 0.001) -> float | None:
    """Other tasks runnable right now, system-wide (procs_running of /proc/stat,
    less this one), averaged over a few samples a millisecond apart."""
    seen = []
    for i in range(samples):
        try:
            with open("/proc/stat") as f:
                line = next(ln for ln in f if ln.startswith("procs_running "))
        except (OSError, StopIteration):
            return None
        seen.append(max(int(line.split()[1]) - 1, 0))
        if i + 1 < samples:
            time.sleep(gap_s)
    return sum(seen) / len(seen)


def choose(env: Mapping[str, str], load: float | None, cpus: int,
           running=None) -> str | None:
    """The OMP_WAIT_POLICY to set, or None to leave libgomp's default.
    load: the 1-minute load average (None when unknown); cpus: CPUs allowed;
    running: a callable giving the other tasks runnable now (None if unknown),
    asked only when the load says busy."""
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env or load is None:
        return None
    # the engine runs one thread per allowed CPU: any other runnable work oversubscribes
    total = os.cpu_count() or cpus
    if load * cpus / total < BUSY_CPUS:  # system-wide; the share that falls on ours
        return None
    now = (running or running_others)()
    return "PASSIVE" if now is None or now * cpus / total >= BUSY_CPUS else None


def apply(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set OMP_WAIT_POLICY as choose() says, if torch (and libgomp) is not loaded yet."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules:
        return None
    policy = choose(environ, load_average(), len(os.sched_getaffinity(0)))
    if policy:
        environ["OMP_WAIT_POLICY"] = policy
    return policy
