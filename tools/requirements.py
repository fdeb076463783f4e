"""Read requirements/*.txt, the one home of every pin.

The build backend's get_requires hooks and the wheel's Requires-Dist both come
from here, so a pin is written once and used everywhere.
"""
from __future__ import annotations

from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from tools.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS_DIR = REPO_ROOT / "requirements"


def read_requirements(path: Path, _seen: frozenset[Path] = frozenset()) -> list[str]:
    """Requirement strings of a pip requirements file, following `-r` includes."""
    path = path.resolve()
    if path in _seen:
        raise UserError(f"{path}: requirements files include each other in a loop")
    if not path.is_file():
        raise UserError(f"requirements file {path} does not exist")
    out: list[str] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            include = line.split(None, 1)[1].strip()
            out += read_requirements(path.parent / include, _seen | {path})
            continue
        if line.startswith("-"):
            raise UserError(
                f"{path}:{lineno}: option {line!r} is not supported here; index options "
                "belong on the installer's command line, not in requirement files"
            )
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise UserError(f"{path}:{lineno}: invalid requirement {line!r}: {exc}") from None
        if line not in out:
            out.append(line)
    return out


def runtime_requirements(variant: str) -> list[str]:
    return read_requirements(REQUIREMENTS_DIR / f"{variant}.txt")


def build_requirements(variant: str) -> list[str]:
    return read_requirements(REQUIREMENTS_DIR / "build" / f"{variant}.txt")
