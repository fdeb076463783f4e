"""One home for each environment variable, across the tree: the engine reads its
VLLM_* variables in engine/envs.py (test_env_home.py checks that in detail), the
wheel index in wheel_index/envs.py, the benchmarks through engine/envs.py, and
every VLLM_* name read anywhere in engine/, tools/, wheel_index/ or benchmarks/ is
documented in docs/environment-variables.md."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from test_env_home import env_reads

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "environment-variables.md"
#: each top-level folder's one file that reads the environment by name (None: none may)
HOMES = {"engine": "engine/envs.py", "wheel_index": "wheel_index/envs.py", "benchmarks": None,
         "tools": "tools/build_settings.py"}


def reads(top: str) -> list[tuple[str, int, str]]:
    """(file, line, name) of every VLLM_* read under REPO/top, a child's
    environment built or trimmed (env.pop on a dict of its own) aside."""
    found = []
    for path in sorted((REPO / top).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        trims = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "pop"
                 and not (isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "environ")}
        found += [(str(path.relative_to(REPO)), line, name)
                  for line, name in env_reads(tree) if line not in trims]
    return found


def test_the_scan_finds_the_reads_it_is_meant_to():
    assert {name for _, _, name in reads("wheel_index")} == {"VLLM_DEBUG", "VLLM_INDEX_LOG"}
    assert ("engine/envs.py", 58, "VLLM_CPU_MAX_ISA") in reads("engine")


def _stray(top: str) -> list[str]:
    return [f"{f}:{line} reads {name}" for f, line, name in reads(top) if f != HOMES[top]]


@pytest.mark.parametrize("top", ["engine", "wheel_index", "benchmarks", "tools"])
def test_each_folder_reads_its_variables_in_its_home_only(top):
    stray = _stray(top)
    assert not stray, f"read these through {HOMES[top] or 'engine/envs.py'}: " + "; ".join(stray)


def test_every_variable_read_is_documented():
    doc = DOC.read_text()
    missing = sorted({f"{name} ({f}:{line})" for top in HOMES for f, line, name in reads(top)
                      if f"`{name}`" not in doc})
    assert not missing, f"not in docs/environment-variables.md: {missing}"
