"""benchmarks/hostile.py against a real `engine serve`: ~770 hostile requests
and connections, no 5xx, no hang, no death (issue 39)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow


def test_no_hostile_request_gets_a_5xx_a_hang_or_a_death():
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "hostile.py"), "--check"],
                         cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "5xx: 0, hangs (> 30 s): 0, deaths: 0" in res.stdout, res.stdout[-2000:]
