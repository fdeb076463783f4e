"""engine/core/cpu_share.py: the API servers mark their heavy jobs, the engine
core runs its OpenMP team on one thread fewer per job that has run long."""
from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from engine.core import cpu_share


@pytest.fixture
def shared(tmp_path):
    return cpu_share.create(str(tmp_path / "cpu-share"), servers=2)


def team(path, threads=4):
    sizes = []
    return cpu_share.TeamSize(path, threads, sizes.append), sizes


def test_a_long_job_takes_one_thread_from_the_team_until_it_ends(shared):
    t, sizes = team(shared)
    marks = cpu_share.Marks(shared, 0)
    assert t.adjust() == 4 and sizes == []
    with marks.running():
        assert t.adjust() == 4  # not yet long: a usual chat template never resizes
        time.sleep(cpu_share.HEAVY_AFTER_S * 1.5)
        assert t.adjust() == 3 and sizes == [3]
        assert t.adjust() == 3 and sizes == [3]  # resized once, not per step
    assert t.adjust() == 4 and sizes == [3, 4]


def test_a_job_known_long_counts_from_its_start(shared):
    t, sizes = team(shared)
    with cpu_share.Marks(shared, 1).running(known_long=True):
        assert t.adjust() == 3 and sizes == [3]  # a large body: no wait for HEAVY_AFTER_S
    assert t.adjust() == 4


def test_every_api_server_has_its_row_and_the_team_keeps_one_thread(shared):
    t, sizes = team(shared, threads=2)
    a, b = cpu_share.Marks(shared, 0), cpu_share.Marks(shared, 1)
    with a.running(), a.running(), b.running():
        time.sleep(cpu_share.HEAVY_AFTER_S * 1.5)
        assert t.busy(time.monotonic()) == 3
        assert t.adjust() == 1 and sizes == [1]
    assert t.busy(time.monotonic()) == 0


def test_jobs_past_the_slots_run_unmarked(shared):
    t, _ = team(shared)
    marks = cpu_share.Marks(shared, 0)
    held = [marks.running() for _ in range(cpu_share.SLOTS + 3)]
    for h in held:
        h.__enter__()
    time.sleep(cpu_share.HEAVY_AFTER_S * 1.5)
    assert t.busy(time.monotonic()) == cpu_share.SLOTS
    for h in held:
        h.__exit__(None, None, None)
    assert t.busy(time.monotonic()) == 0


def test_in_thread_marks_its_job_while_it_runs(shared, monkeypatch):
    t, _ = team(shared)
    monkeypatch.setattr(cpu_share, "_marks", None)
    cpu_share.attach(shared, 1)
    seen = []
    release = threading.Event()

    def job(x):
        release.wait(5)
        return x * 2

    async def main():
        task = asyncio.ensure_future(cpu_share.in_thread(job, 21))
        await asyncio.sleep(cpu_share.HEAVY_AFTER_S * 2)
        seen.append(t.busy(time.monotonic()))
        release.set()
        return await task

    assert asyncio.run(main()) == 42
    assert seen == [1] and t.busy(time.monotonic()) == 0
    cpu_share.attach("", 0)
    assert cpu_share._marks is None  # detached: a no-op, as offline and in tests


def test_the_core_addresses_carry_a_fresh_file(tmp_path):
    from engine.core.core_client import ipc_addresses

    a = ipc_addresses(str(tmp_path), 3)
    t, _ = team(a.cpu_share)
    assert t.busy(time.monotonic()) == 0
    assert (tmp_path / "cpu-share").stat().st_size == 3 * cpu_share.SLOTS * 8


def test_start_workers_leaves_threads_a_job_finds_started():
    """in_thread's job must not wait for a thread to start (36 ms beside a busy core).
    The first jobs right after start_workers: before it waited for the workers
    to count themselves idle, 5% of such starts began a third thread (the
    server's 0.5 ms switch interval), so the check runs 60 times."""
    async def main():
        await cpu_share.start_workers(2)
        before = {t.ident for t in threading.enumerate()}
        names = await asyncio.gather(*(cpu_share.in_thread(
            lambda: (time.sleep(0.001), threading.current_thread().ident)[1]) for _ in range(2)))
        return before, set(names), {t.ident for t in threading.enumerate()}

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        for _ in range(60):
            before, ran_on, after = asyncio.run(main())
            # no thread started for the jobs (an earlier test's daemon thread may end meanwhile)
            assert ran_on <= before and after <= before
    finally:
        sys.setswitchinterval(interval)
