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
load is confirmed by the runnable tasks of the last 100 ms (not of one
instant: a launcher polling /health every 200 ms, 30 ms of CPU each, read as
a busy CPU in a 5-ms window, and made every served engine it started PASSIVE). An OMP_WAIT_POLICY or
GOMP_SPINCOUNT that is set is never changed. libgomp reads these when it
loads, with torch: a process that imported torch before the engine keeps
what it had. (Not under engine/platforms/: that package imports torch.)

One engine decides once, in the process that starts it: the choice is
written to the environment (to keep spinning: libgomp's own default spin
count, GOMP_SPINCOUNT=300000), so the engine core, replicas and workers it
spawns inherit it. Re-deciding there would count the server's own start-up
(its tokenizer loading beside the core) as other work and make every served
engine PASSIVE: measured, 1-client served decode 95 instead of 230 tok/s.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, MutableMapping

#: other work, in CPUs kept busy on average, at which the allowed CPUs count as shared
BUSY_CPUS = 0.5
#: libgomp's spin count when OMP_WAIT_POLICY is unset (and threads <= CPUs)
DEFAULT_SPINCOUNT = "300000"


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def running_others(samples: int = 20, gap_s: float = 0.005) -> float | None:
    """Other tasks runnable now, system-wide (procs_running of /proc/stat, less
    this one), averaged over `samples` taken `gap_s` apart."""
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
    """Set OMP_WAIT_POLICY as choose() says, if torch (and libgomp) is not
    loaded yet and nothing is set; a choice to spin is written as libgomp's
    default GOMP_SPINCOUNT, for the processes this one spawns."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return None
    policy = choose(environ, load_average(), len(os.sched_getaffinity(0)))
    if policy:
        environ["OMP_WAIT_POLICY"] = policy
    else:
        environ["GOMP_SPINCOUNT"] = DEFAULT_SPINCOUNT
    return policy
