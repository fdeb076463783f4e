"""The package version: setuptools-scm's, plus the variant as a local segment.

Between tags: 0.1.devN+g<hash>.cpu (dirty trees: ...+g<hash>.d<date>.cpu).
On a tag: X.Y.Z+cpu, and plain X.Y.Z for the main CUDA variant only. PEP 440
allows one '+', so the variant joins the existing local segment with a dot.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tools.errors import UserError
from tools.variants import VARIANTS


def scm_version(root: Path) -> str:
    from setuptools_scm import get_version

    try:
        return get_version(root=str(root), version_scheme="guess-next-dev",
                           local_scheme="node-and-date")
    except LookupError as exc:
        raise UserError(
            f"cannot tell the version of the source tree at {root}: it has no git metadata "
            "and no PKG-INFO. Build from a git clone or an sdist, or set "
            "SETUPTOOLS_SCM_PRETEND_VERSION=X.Y.Z."
        ) from exc


def with_variant(version: str, variant: str, default_variant: bool) -> str:
    try:
        v = Version(version)
    except InvalidVersion:
        raise UserError(f"{version!r} is not a PEP 440 version") from None
    local = [p for p in (v.local or "").split(".") if p and p not in VARIANTS]
    if not local and default_variant:
        return v.public  # a tagged release of the main CUDA variant (PyPI)
    return f"{v.public}+{'.'.join(local + [variant])}"


def git_commit(root: Path) -> str | None:
    """The full commit hash of the tree at root, or None outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if len(sha) == 40 else None
