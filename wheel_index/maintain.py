"""Keep an index healthy: list what is published, check every page against the
stored files, prune old commits (never what nightly or a release points at)."""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import unquote

from tools.errors import UserError
from wheel_index.documents import parse_metadata_json
from wheel_index.journal import exclusive
from wheel_index.layout import COMMIT_RE, ENTRY_SUFFIX, METADATA_SUFFIX, PROJECT, project_dir
from wheel_index.levels import entries_in
from wheel_index.storage import Storage
from wheel_index.wheels import WheelEntry


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
                out[view] = parse_metadata_json(data, f"{view}/metadata.json")["commit"]
    return out


def prune(storage: Storage, *, keep_days: int | None = None, keep_commits: int | None = None,
          dry_run: bool = False, log=print, now: float | None = None) -> list[str]:
    """The commits removed (or, with dry_run, that would be), newest first; each is
    logged with its files, so that a dry run shows exactly what a real one removes."""
    if (keep_days is None) == (keep_commits is None):
        raise UserError("prune needs exactly one of --keep-days N or --keep-commits N")
    if (keep_days or 0) < 0 or (keep_commits or 0) < 0:
        raise UserError("--keep-days and --keep-commits must not be negative")
    if dry_run:  # reads only: no lock, nothing written
        return _prune(storage, keep_days, keep_commits, True, log, now)
    with exclusive(storage, log):
        return _prune(storage, keep_days, keep_commits, False, log, now)


def _prune(storage: Storage, keep_days, keep_commits, dry_run: bool, log, now) -> list[str]:
    protected = set(pointers(storage).values())
    commits = published(storage)
    if keep_commits is not None:
        doomed = commits[keep_commits:]
    else:
        cutoff = (now or time.time()) - keep_days * 86400
        doomed = [p for p in commits if p.commit_time < cutoff]
    removed, files_total, bytes_total = [], 0, 0
    for p in doomed:
        if p.commit in protected:
            log(f"keeping {p.commit}: nightly or a release points at it")
            continue
        sizes = storage.sizes(p.commit)
        files_total += len(sizes)
        bytes_total += sum(sizes.values())
        when = datetime.fromtimestamp(p.commit_time, timezone.utc).strftime("%Y-%m-%d %H:%M")
        log(f"{'would remove' if dry_run else 'removing'} {p.commit}  {when}  "
            f"({len(sizes)} file(s), {_size(sum(sizes.values()))})")
        removed.append(p.commit)
        if dry_run:
            for key in sorted(sizes):
                log(f"    {key}")
            continue
        _remove(storage, p, sorted(sizes))
    kept = len(commits) - len(removed)
    if not removed:
        log(f"nothing to remove: {len(commits)} commit(s) published, all kept")
    elif dry_run:
        log(f"dry run: would remove {len(removed)} commit(s), {files_total} file(s), "
            f"{_size(bytes_total)}; would keep {kept}; nothing was removed")
    else:
        log(f"removed {len(removed)} commit(s), {files_total} file(s), {_size(bytes_total)}; "
            f"kept {kept}")
    return removed


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _remove(storage: Storage, p: Published, keys: list[str]) -> None:
    files = [k for k in keys if k.endswith((".whl", METADATA_SUFFIX, ENTRY_SUFFIX))]
    records = [k for k in files if k.endswith(ENTRY_SUFFIX)]
    # pages first (no dangling link), entry records last (while one is left, the
    # commit still counts as published and a rerun retries); a failure stops there
    try:
        storage.delete([k for k in keys if k not in files])
        storage.delete([k for k in files if k not in records])
        storage.delete(records)
        if storage.dir_keys:
            storage.delete([f"{p.commit}/", f"{p.commit}/{PROJECT}/"] + [
                f"{p.commit}/{v}/{s}" for v in p.variants for s in ("", f"{PROJECT}/")])
    except UserError as exc:
        raise UserError(f"prune stopped at {p.commit}: {exc}; nothing after it was "
                        "removed, run prune again") from None


HREF = re.compile(r'<a href="([^"#]+)#sha256=([0-9a-f]{64})"([^>]*)>([^<]+)</a>')


def _link_key(base: str, url: str) -> str:
    """The storage key a page's percent-encoded relative link points at."""
    return posixpath.normpath(posixpath.join(base, unquote(url)))


def verify(storage: Storage, log=print, full: bool = False) -> list[str]:
    """Every problem found; empty when every page matches the stored files.

    Quick (the default) takes every wheel's size and ETag from one listing and
    checks them against the entry records and the JSON pages; only pages and
    the small .metadata files are read. Full also reads every wheel and checks
    its sha256.
    """
    problems: list[str] = []
    stats = storage.stats("")
    sizes = {k: size for k, (size, _) in stats.items()}
    hashes: dict[str, str | None] = {}  # key -> sha256; each file read once

    def digest(key: str) -> str | None:
        if key not in hashes:
            data = storage.read(key) if key in sizes else None
            hashes[key] = hashlib.sha256(data).hexdigest() if data is not None else None
        return hashes[key]

    def record(key: str, where: str):
        data = storage.read(key + ENTRY_SUFFIX)
        try:
            return WheelEntry.from_json(data, key + ENTRY_SUFFIX) if data is not None else None
        except UserError as exc:
            problems.append(f"{where}: {exc}")
            return None

    arches_by_level: dict[str, tuple[int, set[str]]] = {}
    views = []
    for top in storage.list_dirs(""):
        views.append(top)
        views += [f"{top}/{sub}" for sub in storage.list_dirs(top) if sub != PROJECT]
    for view in views:
        proj = project_dir(view)
        page_key = f"{proj}/index.html"
        page = storage.read(page_key)
        if page is None:
            continue
        links = HREF.findall(page.decode("utf-8", "replace"))
        listed = set()
        for url, sha, attrs, name in links:
            key = _link_key(proj, url)
            listed.add(key)
            if key not in sizes:
                problems.append(f"{page_key}: dangling link to {key}")
                continue
            small = name.endswith("-variants.json")  # index metadata: always hashed
            if (full or small) and digest(key) != sha:
                problems.append(f"{page_key}: {name} has sha256 {digest(key)}, the page says {sha}")
            if small:
                continue  # PEP 825 index metadata: no core metadata, no entry record
            m = re.search(r'data-core-metadata="sha256=([0-9a-f]{64})"', attrs)
            if not m or digest(key + METADATA_SUFFIX) != m.group(1):
                problems.append(f"{page_key}: {name}: core metadata missing or its hash differs")
            entry = record(key, page_key)
            if entry is None or entry.sha256 != sha:
                problems.append(f"{page_key}: {name}: entry record missing or disagrees")
            elif entry.size != sizes[key]:
                problems.append(f"{page_key}: {name}: size {sizes[key]} differs from the entry "
                                f"record's {entry.size}")
            elif entry.etag and stats[key][1] and entry.etag != stats[key][1]:
                problems.append(f"{page_key}: {name}: the stored object was replaced since it "
                                f"was published (ETag {stats[key][1]}, published {entry.etag})")
        doc = storage.read(f"{proj}/index.json")
        if doc is None:
            problems.append(f"{view}: PEP 691 index.json is missing")
        else:
            try:
                files = json.loads(doc)["files"]
                by_key = {_link_key(proj, f["url"]): f for f in files}
                if {k: f["hashes"]["sha256"] for k, f in by_key.items()} != {
                        _link_key(proj, u): s for u, s, _, _ in links}:
                    problems.append(f"{view}: index.json and index.html list different files")
                for k, f in by_key.items():
                    if k in sizes and f.get("size") != sizes[k]:
                        problems.append(f"{view}: index.json says {f.get('filename')} has "
                                        f"{f.get('size')} bytes, the stored file {sizes[k]}")
            except (ValueError, KeyError, TypeError, AttributeError):
                problems.append(f"{view}: index.json is not a PEP 691 project page")
        meta = storage.read(f"{view}/metadata.json")
        if meta is None:
            problems.append(f"{view}: metadata.json is missing")
        else:
            try:
                wheels = parse_metadata_json(meta, f"{view}/metadata.json")["wheels"]
            except UserError as exc:
                problems.append(str(exc))
                wheels = []
            for w in wheels:
                key = _link_key(view, w["path"])
                entry = record(key, f"{view}/metadata.json") if key in sizes else None
                if entry is None or entry.sha256 != w["sha256"] or sizes[key] != w["size"]:
                    problems.append(f"{view}/metadata.json: {w['path']} missing, or its size "
                                    "or hash differs")
                elif full and digest(key) != w["sha256"]:
                    problems.append(f"{view}/metadata.json: {w['path']} hash differs")
        first = view.split("/")[0]
        if meta is not None and COMMIT_RE.fullmatch(first) and view.count("/") == 1:
            doc = json.loads(meta)
            arches_by_level[view] = (int(doc.get("commit_time", 0)), {
                architecture(t) for w in doc["wheels"] for t in w["platform_tag"].split(".")})
        if COMMIT_RE.fullmatch(first) and view.count("/") == 1:
            stored = {k[:-len(ENTRY_SUFFIX)] for k in storage.list(proj)
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
    problems: list[str] = []
    seen: dict[str, set[str]] = {}  # variant -> architectures of earlier commits
    for level, (_, arches) in sorted(arches_by_level.items(), key=lambda kv: (kv[1][0], kv[0])):
        variant = level.split("/")[1]
        earlier = seen.setdefault(variant, set())
        problems += [f"{level}: its {arch} wheel is missing (earlier commits of {variant} have one)"
                     for arch in sorted(earlier - arches)]
        earlier |= arches
    return problems
