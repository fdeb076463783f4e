"""No source file in engine/, csrc/, tools/ or wheel_index/ passes 400 lines:
a longer one is split by job (docs and data files aside)."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("engine", "csrc", "tools", "wheel_index")
SOURCE = {".py", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh"}
MAX_LINES = 400


def too_long(root: Path, names: list[str]) -> list[str]:
    """The names (relative to root) of source files over MAX_LINES lines."""
    long = []
    for name in names:
        path = root / name
        if path.suffix in SOURCE and path.is_file():
            lines = len(path.read_text(errors="replace").splitlines())
            if lines > MAX_LINES:
                long.append(f"{name} ({lines} lines)")
    return long


def source_files() -> list[str]:
    """The files git tracks in FOLDERS, and the new ones it does not ignore."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                          "--", *FOLDERS], cwd=REPO, capture_output=True, text=True, check=True)
    return [n for n in out.stdout.splitlines() if n]


def test_the_check_sees_a_long_file(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.h").write_text("int x;\n" * MAX_LINES)
    (tmp_path / "notes.md").write_text("text\n" * 1000)
    assert too_long(tmp_path, ["long.py", "short.h", "notes.md"]) == ["long.py (401 lines)"]


def test_no_source_file_passes_400_lines():
    names = source_files()
    assert any(n.startswith("csrc/") for n in names) and any(n.startswith("engine/") for n in names)
    long = too_long(REPO, names)
    assert not long, f"split these by job (at most {MAX_LINES} lines): {', '.join(long)}"
