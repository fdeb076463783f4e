"""One home for each run-time variable: the engine reads VLLM_* variables in
engine/envs.py only (default, valid forms and error message beside the read),
and every one of them is documented in docs/environment-variables.md."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "engine" / "envs.py"
DOC = REPO / "docs" / "environment-variables.md"


def env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each VLLM_* variable read: env.get("VLLM_X"), getenv("VLLM_X"),
    environ["VLLM_X"] (a write such as a child's environment is not a read)."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args and (
                isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv", "pop")
                or isinstance(node.func, ast.Name) and node.func.id == "getenv"):
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) \
                and key.value.startswith("VLLM_"):
            found.append((node.lineno, key.value))
    return found


def test_the_finder_sees_each_form_of_read():
    code = ('import os\nos.environ.get("VLLM_A")\nos.getenv("VLLM_B")\nx = env["VLLM_C"]\n'
            'os.environ["VLLM_D"] = "1"\nd.get("OTHER")\n')
    assert [n for _, n in env_reads(ast.parse(code))] == ["VLLM_A", "VLLM_B", "VLLM_C"]


def test_the_engine_reads_its_variables_in_envs_py_only():
    stray = [f"{path.relative_to(REPO)}:{line} reads {name}"
             for path in sorted((REPO / "engine").rglob("*.py")) if path != ENVS
             for line, name in env_reads(ast.parse(path.read_text(), str(path)))]
    assert not stray, "read these through engine/envs.py: " + "; ".join(stray)


def test_every_variable_envs_py_reads_is_documented():
    read = {name for _, name in env_reads(ast.parse(ENVS.read_text()))}
    read |= set(re.findall(r'"(VLLM_[A-Z0-9_]+)"', ENVS.read_text()))
    assert read, "engine/envs.py reads no VLLM_* variable: the scan is broken"
    missing = sorted(n for n in read if f"`{n}`" not in DOC.read_text())
    assert not missing, f"not in docs/environment-variables.md: {missing}"
