"""Publish wheels for a commit: validate everything first, store each wheel
once, then (re)write only the pages that change.

Order makes a killed publish harmless: every wheel is refused or accepted
before the index is touched; then, holding the index lock (one publish or
prune at a time, wheel_index/locking.py), every level stores its wheels
(wheel, .metadata, entry) before any page is written, and the pages are
written under a journal that the next publish finishes if this one is killed
(wheel_index/journal.py). The levels are each variant's, then the variants
level of PEP 825 variant wheels.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from packaging.version import Version

from tools import gitutil, kernel_reuse
from tools.errors import UserError
from tools.hashing import sha256_file
from wheel_index import per_variant_level, variants_level
from wheel_index.journal import Plan, PublishResult, exclusive, write_pages
from wheel_index.layout import COMMIT_RE
from wheel_index.storage import Storage
from wheel_index.wheels import inspect_wheel


def check_commit(commit: str) -> str:
    if not COMMIT_RE.fullmatch(commit or ""):
        raise UserError(f"--commit {commit!r} is not a full commit hash (40 lowercase hex "
                        "digits); use `git rev-parse HEAD`")
    return commit


def resolve_commit_time(commit: str, given: str | None) -> int:
    """Seconds since the epoch: --commit-time (epoch or ISO 8601), else the
    committer time git records for the commit in the current repository."""
    if given:
        try:
            return int(given)
        except ValueError:
            try:
                dt = datetime.fromisoformat(given.replace("Z", "+00:00"))
            except ValueError:
                raise UserError(f"--commit-time {given!r} is neither epoch seconds nor "
                                "ISO 8601") from None
            return int(dt.replace(tzinfo=dt.tzinfo or timezone.utc).timestamp())
    out = gitutil.git(Path.cwd(), "show", "-s", "--format=%ct", commit, check=False)
    if not out or not out.isdigit():
        raise UserError(f"cannot tell when {commit} was committed (it is not in this git "
                        "repository); pass --commit-time")
    return int(out)


def publish(storage: Storage, commit: str, wheel_paths: list[Path], *, nightly: bool = False,
            release: bool = False, force: bool = False, allow_rewind: bool = False,
            commit_time: str | None = None, log=print) -> PublishResult:
    check_commit(commit)
    if not wheel_paths:
        raise UserError("no wheels given")
    wheels = [inspect_wheel(Path(p)) for p in wheel_paths]  # refuse before writing anything
    names = [w.filename for w in wheels]
    if len(set(names)) != len(names):
        twice = sorted(n for n in names if names.count(n) > 1)[0]
        raise UserError(f"the same wheel is given twice: {twice}")
    for w in wheels:
        if w.build_commit and w.build_commit != commit:
            # A Python-only commit's wheel carries an earlier commit's kernels
            # (tools/kernel_reuse.py): accepted only when they are this commit's too.
            log(kernel_reuse.check_publishable(w.path, w.build_commit, commit, Path.cwd()))
    release_version = None
    if release:
        publics = {w.version.public for w in wheels}
        if len(publics) != 1 or Version(next(iter(publics))).is_devrelease:
            raise UserError(f"--release needs wheels of one tagged release version, got "
                            f"{', '.join(sorted(str(w.version) for w in wheels))}")
        release_version = next(iter(publics))
    when = resolve_commit_time(commit, commit_time)
    shas = {w.filename: sha256_file(w.path) for w in wheels}
    with exclusive(storage, log):
        for w in wheels:  # conflicts are refused before anything is stored
            per_variant_level.published(storage, w, commit, shas[w.filename], force)
        variant_wheels = variants_level.prepare(storage, commit, wheels, force, log)
        result = PublishResult(variants=PublishResult())
        try:
            for w in wheels:
                per_variant_level.store(storage, w, shas[w.filename], commit, when, force, log,
                                        result)
            made = variants_level.store(storage, variant_wheels, when, log, result.variants)
        finally:
            variant_wheels.close()
        plan = Plan(commit, when, sorted({w.variant for w in wheels}), made, nightly,
                    release_version, allow_rewind)
        write_pages(storage, plan, log, result)
    return result
