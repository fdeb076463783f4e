"""benchmarks.common.Targets: the one place a benchmark's `--check` decides pass or fail."""
from __future__ import annotations

import pytest

from benchmarks.common import Targets


def test_met_targets_exit_zero_with_check(capsys):
    t = Targets()
    assert t.record("speedup", 2.5, 2.0)
    assert t.record("no-op rebuild", 1.9, 5.0, higher_is_better=False, unit="s")
    assert t.finish(check=True) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "MISS" not in out


def test_missed_target_exits_one_naming_it(capsys):
    t = Targets()
    t.record("speedup", 2.5, 2.0)
    assert not t.record("warm rebuild", 0.45, 0.30, higher_is_better=False)
    with pytest.raises(SystemExit) as exc:
        t.finish(check=True)
    # SystemExit with a message: Python prints it to stderr and exits 1.
    assert "warm rebuild" in str(exc.value.code) and "speedup" not in str(exc.value.code)
    assert "MISS" in capsys.readouterr().out


def test_miss_without_check_is_informative_only():
    t = Targets()
    t.record("speedup", 1.0, 2.0)
    assert t.finish(check=False) == 0
    assert t.missed() == ["speedup: 1x, target >= 2x"]
