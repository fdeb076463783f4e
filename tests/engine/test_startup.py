"""The command-line entry points answer without importing torch (seconds):
`engine --help`, the first lines of `engine env`, `python -m tools.target`.
benchmarks/startup.py times them."""
from __future__ import annotations

import sys

import pytest
from helpers import REPO, run

PROBE = """
import sys
sys.argv = {argv!r}
try:
    {call}
except SystemExit:
    pass
print("torch imported" if "torch" in sys.modules else "no torch", file=sys.stderr)
"""


@pytest.mark.parametrize("argv,call", [
    (["engine", "--help"], "from engine.cli import main; main(sys.argv[1:])"),
    (["engine", "env"], "from engine.collect_env import static_report; print(static_report())"),
    (["tools.target"], "from tools.target import main; main([])"),
    (["tools.bisect", "--help"], "from tools.bisect import main; main(sys.argv[1:])"),
])
def test_no_torch_import(argv, call):
    res = run([sys.executable, "-c", PROBE.format(argv=argv, call=call)], cwd=REPO)
    assert res.stderr.strip().splitlines()[-1] == "no torch", res.stderr
    assert res.stdout.strip()


def test_engine_env_prints_build_facts_then_torch_facts():
    lines = run([sys.executable, "-m", "engine.collect_env"], cwd=REPO).stdout.splitlines()
    keys = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert keys[0] == "vllm_engine" and "torch" in keys
    assert keys.index("variant") < keys.index("torch")


def test_bisect_help_keeps_its_usage_lines_and_names_run_one():
    out = run([sys.executable, "-m", "tools.bisect", "--help"], cwd=REPO).stdout
    lines = out.splitlines()
    assert "    python -m tools.bisect run-one REV [--variant V] [--index URL] -- CMD..." in lines
    assert "  git bisect run python -m tools.bisect run-one HEAD -- CMD..." in lines
    sub = run([sys.executable, "-m", "tools.bisect", "run-one", "--help"], cwd=REPO).stdout
    assert "exit 0 good, 125 skip" in " ".join(sub.split())
