"""Publish wheels for a commit: validate everything first, store each wheel
once, then (re)write only the pages that change.

Order makes a killed publish harmless: wheel, then .metadata, then the entry
that pages are rendered from, then the pages (each written atomically). Pages
are rendered from the entries actually stored and re-checked after writing, so
publishers of other variants or architectures of the same commit, running at
the same time, never drop each other's wheels.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from packaging.version import Version

from tools import gitutil, kernel_reuse
from tools.errors import UserError
from tools.hashing import sha256_file
from tools.variants import is_default_variant
from wheel_index import pages, variants_level
from wheel_index.layout import (
    COMMIT_RE,
    ENTRY_SUFFIX,
    METADATA_SUFFIX,
    NIGHTLY,
    PROJECT,
    level_dir,
    project_dir,
)
from wheel_index.storage import Storage
from wheel_index.wheels import InspectedWheel, WheelEntry, inspect_wheel

CONVERGE_ATTEMPTS = 8


@dataclass
class PublishResult:
    stored: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    pages_written: list[str] = field(default_factory=list)
    nightly_moved: dict[str, bool] = field(default_factory=dict)
    variants: PublishResult | None = None  # what the variants level did, kept apart


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


def entry_key(commit: str, variant: str, filename: str) -> str:
    return f"{project_dir(level_dir(commit, variant))}/{filename}{ENTRY_SUFFIX}"


def entries_in(storage: Storage, commit: str, variant: str) -> list[WheelEntry]:
    prefix = project_dir(level_dir(commit, variant))
    out = []
    for key in storage.list(prefix):
        if key.endswith(ENTRY_SUFFIX):
            data = storage.read(key)
            if data:
                out.append(WheelEntry.from_json(data, key))
    return sorted(out, key=lambda e: (Version(e.version), e.filename))


def _write_if_changed(storage: Storage, key: str, data: bytes, written: list[str]) -> None:
    if storage.read(key) != data:
        storage.write_atomic(key, data)
        written.append(key)


def render_view(storage: Storage, view_dir: str, commit: str, variant: str, pointer: dict,
                written: list[str], keep: Callable[[WheelEntry], bool] = lambda e: True) -> None:
    """Write a view's pages from the entries stored for (commit, variant), and
    repeat until what was rendered is what is stored."""
    entries = [e for e in entries_in(storage, commit, variant) if keep(e)]
    for _ in range(CONVERGE_ATTEMPTS):
        proj = project_dir(view_dir)
        html = pages.project_html(entries, view_dir)
        _write_if_changed(storage, f"{proj}/index.html", html, written)
        _write_if_changed(storage, f"{proj}/index.json", pages.project_json(entries, view_dir),
                          written)
        prefix = f"{view_dir}/" if view_dir else ""
        _write_if_changed(storage, f"{prefix}index.html", pages.root_html(), written)
        _write_if_changed(storage, f"{prefix}index.json", pages.root_json(), written)
        if storage.dir_keys:
            _write_if_changed(storage, f"{proj}/", html, written)
            _write_if_changed(storage, prefix, pages.root_html(), written)
        _write_if_changed(storage, f"{prefix}metadata.json",
                          pages.level_metadata(entries, view_dir, pointer), written)
        now = [e for e in entries_in(storage, commit, variant) if keep(e)]
        if now == entries:
            return
        entries = now  # another publisher added a wheel meanwhile: render again
    raise UserError(f"{view_dir}: the stored wheels kept changing while its pages were "
                    "written; run the publish again")


def _published(storage: Storage, w: InspectedWheel, commit: str, sha: str,
               force: bool) -> WheelEntry | None:
    """The entry already stored under this wheel's name; refuses different bytes."""
    existing = storage.read(entry_key(commit, w.variant, w.filename))
    if existing is None:
        return None
    old = WheelEntry.from_json(existing)
    if old.sha256 != sha and not force:
        raise UserError(f"{project_dir(level_dir(commit, w.variant))}/{w.filename} is already "
                        f"published with different bytes (sha256 {old.sha256[:12]}..., new "
                        f"{sha[:12]}...); a published wheel never changes. Use --force to "
                        "replace it.")
    return old


def _store(storage: Storage, w: InspectedWheel, sha: str, commit: str, commit_time: int,
           force: bool, log, result: PublishResult) -> None:
    proj = project_dir(level_dir(commit, w.variant))
    old = _published(storage, w, commit, sha, force)
    if old is not None:
        if old.sha256 == sha:
            result.unchanged.append(w.filename)
            return
        log(f"--force: replacing {proj}/{w.filename} (sha256 {old.sha256} -> {sha})")
    storage.upload_file(f"{proj}/{w.filename}", w.path)
    entry = WheelEntry(
        filename=w.filename, name=PROJECT, version=str(w.version), variant=w.variant,
        python_tag=w.tags[0], abi_tag=w.tags[1], platform_tag=w.tags[2], sha256=sha,
        size=w.path.stat().st_size, metadata_sha256=hashlib.sha256(w.metadata).hexdigest(),
        requires_python=w.requires_python,
        upload_time=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        commit=commit, commit_time=commit_time, etag=storage.etag(f"{proj}/{w.filename}"))
    storage.write_atomic(f"{proj}/{w.filename}{METADATA_SUFFIX}", w.metadata)
    storage.write_atomic(entry_key(commit, entry.variant, entry.filename), entry.to_json())
    result.stored.append(w.filename)


def _nightly_may_move(storage: Storage, view: str, commit: str, commit_time: int,
                      allow_rewind: bool, log) -> bool:
    current = storage.read(f"{view}/metadata.json")
    if current is None:
        return True
    cur = json.loads(current)
    if cur.get("commit") == commit or allow_rewind:
        return True
    if int(cur.get("commit_time", 0)) > commit_time:
        log(f"{view} stays at {cur['commit']} (committed after {commit}); nightly only moves "
            "forward, --allow-rewind moves it back")
        return False
    return True


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
    for w in wheels:  # conflicts are refused before anything is stored
        _published(storage, w, commit, shas[w.filename], force)
    variant_wheels = variants_level.prepare(storage, commit, wheels, force, log)

    result = PublishResult()
    for w in wheels:
        _store(storage, w, shas[w.filename], commit, when, force, log, result)

    for variant in sorted({w.variant for w in wheels}):
        default = is_default_variant(variant)
        pointer = {"project": PROJECT, "commit": commit, "commit_time": when, "variant": variant}
        views = [level_dir(commit, variant)] + ([commit] if default else [])
        for view in views:
            render_view(storage, view, commit, variant, {**pointer, "view": view},
                        result.pages_written)
        if nightly:
            nviews = [f"{NIGHTLY}/{variant}"] + ([NIGHTLY] if default else [])
            moved = _nightly_may_move(storage, nviews[0], commit, when, allow_rewind, log)
            result.nightly_moved[variant] = moved
            if moved:
                for view in nviews:
                    render_view(storage, view, commit, variant, {**pointer, "view": view},
                                result.pages_written)
        if release_version:
            rviews = [f"{release_version}/{variant}"] + ([release_version] if default else [])
            for view in rviews:
                render_view(storage, view, commit, variant,
                            {**pointer, "view": view, "release": release_version},
                            result.pages_written,
                            keep=lambda e: Version(e.version).public == release_version)
    result.variants = PublishResult()
    variants_level.publish(storage, variant_wheels, when, nightly=nightly,
                           release_version=release_version, allow_rewind=allow_rewind, log=log,
                           result=result.variants)
    return result

