"""The few git questions the build front-end asks, each one git command."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tools.errors import UserError

#: What the compiled kernels are made from: a change here needs a real build
#: (requirements/torch: the torch pin the kernels are compiled against).
COMPILED_INPUTS = ("csrc", "CMakeLists.txt", "cmake", "requirements/build", "requirements/torch")


def git(root: Path, *args: str, check: bool = True) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        if check:
            raise UserError(f"git {' '.join(args)} failed: {exc}") from None
        return None
    if out.returncode != 0:
        if check:
            raise UserError(f"git {' '.join(args)} failed: {out.stderr.strip()}")
        return None
    return out.stdout.strip()


def is_repo(root: Path) -> bool:
    return git(root, "rev-parse", "--git-dir", check=False) is not None


def rev(root: Path, ref: str) -> str | None:
    return git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)


def is_shallow(root: Path) -> bool:
    return git(root, "rev-parse", "--is-shallow-repository", check=False) == "true"


def merge_base(root: Path, a: str, b: str) -> str | None:
    return git(root, "merge-base", a, b, check=False)


def first_parents(root: Path, start: str, limit: int) -> list[str]:
    """start and its first-parent ancestors, newest first."""
    out = git(root, "rev-list", "--first-parent", f"--max-count={limit}", start)
    return out.split() if out else []


def compiled_inputs_differ(root: Path, a: str, b: str | None) -> list[str]:
    """Compiled-input files that differ between commit a and commit b, or the
    working tree (committed and uncommitted changes, untracked files) when b is None."""
    args = ["diff", "--name-only", a] + ([b] if b else []) + ["--", *COMPILED_INPUTS]
    changed = set((git(root, *args) or "").split())
    if b is None:
        untracked = git(root, "ls-files", "--others", "--exclude-standard", "--",
                        *COMPILED_INPUTS) or ""
        changed |= set(untracked.split())
    return sorted(changed)


def subject(root: Path, commit: str) -> str:
    return git(root, "show", "-s", "--format=%s", commit) or ""


def is_ancestor(root: Path, a: str, b: str) -> bool | None:
    """Whether commit a is an ancestor of commit b (or b itself); None when this
    repository cannot tell (not a repository, or either commit is not in it)."""
    try:
        out = subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=root,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    # 0 yes, 1 no; anything else (128: an unknown commit, no repository) is no answer
    return {0: True, 1: False}.get(out.returncode)
