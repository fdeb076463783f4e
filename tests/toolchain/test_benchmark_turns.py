"""benchmarks.common's turns: while one side of a comparison runs, every other
loaded side's process tree is stopped, and nothing is left stopped."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks import common

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a parent that starts a child of its own (as vLLM runs its engine core), both idle
TREE = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); time.sleep(60)")


class Side:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", TREE])
        deadline = time.monotonic() + 10
        while len(common.process_tree(self.proc.pid)) < 2:
            assert time.monotonic() < deadline, "the side's child never started"
            time.sleep(0.02)


def states(side) -> set[str]:
    out = set()
    for pid in common.process_tree(side.proc.pid):
        with open(f"/proc/{pid}/stat") as f:
            out.add(f.read().rsplit(")", 1)[1].split()[0])
    return out


def settled(side, want: str) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if states(side) == {want}:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def sides():
    """Two loaded sides, both taking turns."""
    made = [Side(), Side()]
    for side in made:
        common.join_turns(side)
    yield made
    for side in made:
        common.leave_turns(side)
        side.proc.kill()
        side.proc.wait()


def test_the_side_not_taking_its_turn_is_stopped_child_and_all(sides):
    a, b = sides
    common.take_turn(a)
    assert settled(b, "T") and settled(a, "S")
    common.take_turn(b)
    assert settled(a, "T") and settled(b, "S")


def test_leaving_continues_a_stopped_side_and_it_is_stopped_no_more(sides):
    a, b = sides
    common.take_turn(a)
    assert settled(b, "T")
    common.leave_turns(b)
    assert settled(b, "S")
    common.take_turn(a)
    assert settled(b, "S")  # left: a later turn does not stop it


def test_a_benchmark_that_ends_leaves_nothing_stopped(sides):
    a, b = sides
    common.take_turn(a)
    assert settled(b, "T")
    common._continue_all()  # what atexit runs
    assert settled(a, "S") and settled(b, "S")
    assert common._SIDES == []
