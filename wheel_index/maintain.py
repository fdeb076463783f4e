"""Keep an index healthy: list what is published, check every page against the
stored files, prune old commits (never what nightly or a release points at)."""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
import time
from dataclasses import dataclass

from tools.errors import UserError
from wheel_index.layout import COMMIT_RE, ENTRY_SUFFIX, METADATA_SUFFIX, PROJECT, project_dir
from wheel_index.publish import entries_in
from wheel_index.storage import Storage


@dataclass
class Published:
    commit: str
    commit_time: int
    variants: dict[str, list[str]]  # variant -> wheel filenames


def published(storage: Storage, commit: str | None = None,
              variant: str | None = None) -> list[Published]:
    """Commits and their wheels, newest commit first."""
    out = []
    commits = [commit] if commit else [d for d in storage.list_dirs("") if COMMIT_RE.fullmatch(d)]
    for c in commits:
        variants, when = {}, 0
        for v in storage.list_dirs(c):
            if v == PROJECT or (variant and v != variant):
                continue
            entries = entries_in(storage, c, v)
            if entries:
                variants[v] = [e.filename for e in entries]
                when = max(when, entries[0].commit_time)
        if variants:
            out.append(Published(c, when, variants))
    return sorted(out, key=lambda p: (p.commit_time, p.commit), reverse=True)


def pointers(storage: Storage) -> dict[str, str]:
    """view -> commit, for every nightly and release view."""
    out = {}
    for top in storage.list_dirs(""):
        if COMMIT_RE.fullmatch(top):
            continue
        for view in [top] + [f"{top}/{sub}" for sub in storage.list_dirs(top) if sub != PROJECT]:
            data = storage.read(f"{view}/metadata.json")
            if data:
                out[view] = json.loads(data)["commit"]
    return out


def prune(storage: Storage, *, keep_days: int | None = None, keep_commits: int | None = None,
          dry_run: bool = False, log=print, now: float | None = None) -> list[str]:
    if (keep_days is None) == (keep_commits is None):
        raise UserError("prune needs exactly one of --keep-days N or --keep-commits N")
    if (keep_days or 0) < 0 or (keep_commits or 0) < 0:
        raise UserError("--keep-days and --keep-commits must not be negative")
    protected = set(pointers(storage).values())
    commits = published(storage)
    if keep_commits is not None:
        doomed = commits[keep_commits:]
    else:
        cutoff = (now or time.time()) - keep_days * 86400
        doomed = [p for p in commits if p.commit_time < cutoff]
    removed = []
    for p in doomed:
        if p.commit in protected:
            log(f"keeping {p.commit}: nightly or a release points at it")
            continue
        log(f"{'would remove' if dry_run else 'removing'} {p.commit}")
        removed.append(p.commit)
        if not dry_run:
            keys = storage.list(p.commit)
            files = [k for k in keys if k.endswith((".whl", METADATA_SUFFIX, ENTRY_SUFFIX))]
            storage.delete([k for k in keys if k not in files])  # pages first: no dangling link
            storage.delete(files)
            if storage.dir_keys:
                storage.delete([f"{p.commit}/", f"{p.commit}/{PROJECT}/"] + [
                    f"{p.commit}/{v}/{s}" for v in p.variants for s in ("", f"{PROJECT}/")])
    return removed


HREF = re.compile(r'<a href="([^"#]+)#sha256=([0-9a-f]{64})"([^>]*)>([^<]+)</a>')


def verify(storage: Storage, log=print) -> list[str]:
    """Every problem found; empty when every page matches the stored files."""
    problems: list[str] = []
    seen: dict[str, tuple[str, int] | None] = {}  # key -> (sha256, size); each file read once

    def stat(key: str) -> tuple[str, int] | None:
        if key not in seen:
            data = storage.read(key)
            seen[key] = (hashlib.sha256(data).hexdigest(), len(data)) if data is not None else None
        return seen[key]

    def digest(key: str) -> str | None:
        found = stat(key)
        return found[0] if found else None

    arches_by_level: dict[str, tuple[int, set[str]]] = {}
    views = []
    for top in storage.list_dirs(""):
        views.append(top)
        views += [f"{top}/{sub}" for sub in storage.list_dirs(top) if sub != PROJECT]
    for view in views:
        page_key = f"{project_dir(view)}/index.html"
        page = storage.read(page_key)
        if page is None:
            continue
        links = HREF.findall(page.decode())
        listed = set()
        for url, sha, attrs, name in links:
            key = posixpath.normpath(posixpath.join(project_dir(view), url))
            listed.add(key)
            actual = digest(key)
            if actual is None:
                problems.append(f"{page_key}: dangling link to {key}")
                continue
            if actual != sha:
                problems.append(f"{page_key}: {name} has sha256 {actual}, the page says {sha}")
            m = re.search(r'data-core-metadata="sha256=([0-9a-f]{64})"', attrs)
            meta = digest(key + METADATA_SUFFIX)
            if not m or meta != m.group(1):
                problems.append(f"{page_key}: {name}: core metadata missing or its hash differs")
            entry = storage.read(key + ENTRY_SUFFIX)
            if entry is None or json.loads(entry)["sha256"] != actual:
                problems.append(f"{page_key}: {name}: entry record missing or disagrees")
            elif json.loads(entry)["size"] != stat(key)[1]:
                problems.append(f"{page_key}: {name}: size differs from the entry record")
        doc = storage.read(f"{project_dir(view)}/index.json")
        if doc is None:
            problems.append(f"{view}: PEP 691 index.json is missing")
        else:
            files = {posixpath.normpath(posixpath.join(project_dir(view), f["url"])):
                     f["hashes"]["sha256"] for f in json.loads(doc)["files"]}
            if files != {posixpath.normpath(posixpath.join(project_dir(view), u)): s
                         for u, s, _, _ in links}:
                problems.append(f"{view}: index.json and index.html list different files")
        meta = storage.read(f"{view}/metadata.json")
        if meta is None:
            problems.append(f"{view}: metadata.json is missing")
        else:
            for w in json.loads(meta)["wheels"]:
                key = posixpath.normpath(posixpath.join(view, w["path"]))
                if digest(key) != w["sha256"]:
                    problems.append(f"{view}/metadata.json: {w['path']} missing or hash differs")
        first = view.split("/")[0]
        if meta is not None and COMMIT_RE.fullmatch(first) and view.count("/") == 1:
            doc = json.loads(meta)
            arches_by_level[view] = (int(doc.get("commit_time", 0)), {
                architecture(t) for w in doc["wheels"] for t in w["platform_tag"].split(".")})
        if COMMIT_RE.fullmatch(first) and view.count("/") == 1:
            stored = {k[:-len(ENTRY_SUFFIX)] for k in storage.list(project_dir(view))
                      if k.endswith(ENTRY_SUFFIX)}
            for missing in sorted(stored - listed):
                problems.append(f"{page_key}: does not list stored wheel {missing}")
    problems += missing_architectures(arches_by_level)
    for p in problems:
        log(f"MISMATCH {p}")
    return problems


def architecture(platform_tag: str) -> str:
    """manylinux_2_34_aarch64 -> aarch64"""
    return re.sub(r"^(?:(?:many|musl)linux_\d+_\d+|manylinux\d+|linux)_", "", platform_tag)


def missing_architectures(arches_by_level: dict[str, tuple[int, set[str]]]) -> list[str]:
    """`<commit>/<variant>` levels lacking an architecture that an earlier commit
    of the variant has (by commit time): that architecture's build or publish did
    not happen. Commits from before an architecture was added are not reported."""
    problems, seen = [], {}  # variant -> architectures of earlier commits
    for level, (_, arches) in sorted(arches_by_level.items(), key=lambda kv: (kv[1][0], kv[0])):
        variant = level.split("/")[1]
        earlier = seen.setdefault(variant, set())
        problems += [f"{level}: its {arch} wheel is missing (earlier commits of {variant} have one)"
                     for arch in sorted(earlier - arches)]
        earlier |= arches
    return problems
