"""engine.omp_wait_policy: OpenMP threads sleep at barriers (PASSIVE) when the
allowed CPUs are already busy as the engine starts; a setting given is kept."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers import REPO

from engine import omp_wait_policy as wp


def busy(n):
    return lambda: n


def test_busy_cpus_get_passive_waiting(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert wp.choose({}, load=1.0, cpus=2, running=busy(1.0)) == "PASSIVE"  # one busy neighbour
    assert wp.choose({}, load=0.1, cpus=2, running=busy(1.0)) is None  # quiet: libgomp's default
    assert wp.choose({}, load=None, cpus=2, running=busy(1.0)) is None


def test_a_load_of_work_that_has_ended_keeps_spinning(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert wp.choose({}, load=1.4, cpus=2, running=busy(0.0)) is None
    assert wp.choose({}, load=1.4, cpus=2, running=busy(0.2)) is None
    assert wp.choose({}, load=1.4, cpus=2, running=busy(None)) == "PASSIVE"  # unknown: the load


def test_the_load_is_shared_out_over_the_machine(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert wp.choose({}, load=8.0, cpus=2, running=busy(8.0)) is None  # a quarter CPU on our 2
    assert wp.choose({}, load=32.0, cpus=2, running=busy(32.0)) == "PASSIVE"
    assert wp.choose({}, load=32.0, cpus=2, running=busy(4.0)) is None


def test_running_others_reads_this_instant():
    now = wp.running_others(samples=2, gap_s=0)
    assert now is None or now >= 0


def test_a_given_setting_is_kept(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for given in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        assert wp.choose(given, load=4.0, cpus=2, running=busy(4.0)) is None


def test_the_choice_is_inherited_not_remade(monkeypatch):
    """A spawned engine core must not count its own server's start-up as other
    work: whatever the first process chose, its children find it set."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(wp, "load_average", lambda: 0.0)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    env: dict[str, str] = {}
    assert wp.apply(env) is None and env == {"GOMP_SPINCOUNT": wp.DEFAULT_SPINCOUNT}
    monkeypatch.setattr(wp, "load_average", lambda: 9.0)
    monkeypatch.setattr(wp, "running_others", lambda: 9.0)
    child = dict(env)
    assert wp.apply(child) is None and child == env  # busy now, but the choice was made
    env = {}
    assert wp.apply(env) == "PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.slow  # a Python start with torch
def test_import_engine_sets_it_before_torch_loads():
    probe = ("import os; os.getloadavg = lambda: (9.0, 9.0, 9.0)\n"
             "import engine, torch\n"
             "print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    # neighbours that are runnable as the engine starts, one per CPU
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.3)
        res = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                             text=True, timeout=300, env={**env, "PYTHONPATH": str(REPO)})
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert res.stdout.strip() == "PASSIVE", res.stdout + res.stderr
