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


def test_record_upserts_per_machine_and_keeps_the_rest(tmp_path):
    from benchmarks.common import record

    path = tmp_path / "RESULTS.md"
    record("build", [("no-op rebuild", "1.9s", "<= 5s met")], path=path,
           machine_name="CPU A (avx2, 2 CPUs)", day="2026-01-01")
    record("index", [("publish | S3", "1.06x", "<= 1.5x met")], path=path,
           machine_name="CPU A (avx2, 2 CPUs)", day="2026-01-01")
    record("build", [("no-op rebuild", "2.5s", "<= 5s met")], path=path,
           machine_name="CPU B (avx512, 4 CPUs)", day="2026-01-02")
    record("build", [("no-op rebuild", "1.7s", "<= 5s met")], path=path,
           machine_name="CPU A (avx2, 2 CPUs)", day="2026-01-03")
    text = path.read_text()
    assert text.startswith("# Benchmark results")
    assert text.count("## build") == 1 and text.count("## index") == 1
    assert "1.9s" not in text  # replaced: same measure, same machine
    assert "| no-op rebuild | 1.7s | <= 5s met | CPU A (avx2, 2 CPUs) | 2026-01-03 |" in text
    assert "| no-op rebuild | 2.5s | <= 5s met | CPU B (avx512, 4 CPUs) | 2026-01-02 |" in text
    assert "publish \\| S3" in text  # a cell's | is escaped, and survives a rewrite
    assert not list(tmp_path.glob(".RESULTS.*"))  # the temporary file is gone


def test_targets_record_as_writes_the_table(tmp_path, monkeypatch, capsys):
    import benchmarks.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "RESULTS.md")
    t = Targets()
    t.record("warm rebuild", 0.2, 0.3, higher_is_better=False)
    assert t.finish(check=False, record_as="build") == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| warm rebuild | 0.2x | <= 0.3x met | " in text and common.machine() in text


def test_machine_names_cpu_model_isa_and_count():
    from benchmarks.common import cpu_model, kernel_isa, machine

    assert machine() == f"{cpu_model()} ({kernel_isa()}, {__import__('os').cpu_count()} CPUs)"
    assert kernel_isa() != "unknown"


def test_a_peer_that_failed_to_start_is_named_by_its_root_cause(tmp_path):
    from benchmarks.quant import peer_failure

    log = tmp_path / "vllm.log"
    log.write_text(
        "(Worker pid=7) ERROR 12-02 18:04:26 [multiproc_executor.py:953] Traceback (most recent"
        " call last):\n"
        "(Worker pid=7) ERROR 12-02 18:04:26 [multiproc_executor.py:953]     raise ValueError(\n"
        "(Worker pid=7) ERROR 12-02 18:04:26 [multiproc_executor.py:953] ValueError: Failed to "
        "find a kernel that can implement the WNA16 linear layer. Reasons: \n"
        "(Worker pid=7) ERROR 12-02 18:04:26 [multiproc_executor.py:953]  CPUWNA16LinearKernel "
        "cannot implement due to: Input size (5456) not supported by CPUWNA16\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert peer_failure(log) == ("ValueError: Failed to find a kernel that can implement the "
                                 "WNA16 linear layer. Reasons: CPUWNA16LinearKernel cannot "
                                 "implement due to: Input size (5456) not supported by CPUWNA16")
    log.write_text("nothing to see\n")
    assert peer_failure(log) == f"see {log}"
