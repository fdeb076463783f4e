"""The variants level: one project page per commit listing the PEP 825 variant
wheels of every variant and architecture published for it, and the
``{name}-{version}-variants.json`` that maps their labels to properties.

    <commit>/variants/vllm-engine/<variant wheel>          stored once, immutable
    <commit>/variants/vllm-engine/<variant wheel>.metadata  PEP 658 core metadata
    <commit>/variants/vllm-engine/<...>.entry.json          what the pages say of it
    <commit>/variants/vllm-engine/<name>-<version>-variants.json   rewritten as variants arrive
    <commit>/variants/..., nightly/variants/..., <version>/variants/...   pages

Written by every publish, after the per-variant levels. Publishers of other
variants of the same commit run concurrently, so variants.json and the pages
are rendered from the stored entries and re-rendered until stable, like the
per-variant views. variants.json is written before the page that carries its
hash, so a client sees a new variants.json with an old page at worst for the
moment between the two writes (PEP 825 allows the file to change).
"""
from __future__ import annotations

import hashlib
import html
import json
import posixpath
import tempfile
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from packaging.version import Version

from tools.errors import UserError
from tools.hashing import sha256_file
from wheel_index import pages
from wheel_index.layout import (ENTRY_SUFFIX, METADATA_SUFFIX, NIGHTLY, PROJECT, href,
                                project_dir, url_path)
from wheel_index.variant_wheels import (
    base_version,
    encode,
    make_variant_wheel,
    metadata_doc,
    properties,
    variants_json_name,
)
from wheel_index.wheels import InspectedWheel, WheelEntry

VARIANTS = "variants"
CONVERGE_ATTEMPTS = 8


def level_dir(commit: str) -> str:
    return f"{commit}/{VARIANTS}"


def _entries(storage, commit: str) -> list[WheelEntry]:
    from wheel_index.publish import entries_in  # publish imports this module

    return entries_in(storage, commit, VARIANTS)


def _file_key(e: WheelEntry) -> str:
    return f"{project_dir(level_dir(e.commit))}/{e.filename}"


@dataclass
class _Doc:
    """One variants.json: its name, bytes and where it is stored."""
    version: str
    data: bytes
    key: str
    sha256: str = field(init=False)

    def __post_init__(self):
        self.sha256 = hashlib.sha256(self.data).hexdigest()


def _docs(commit: str, entries: list[WheelEntry]) -> list[_Doc]:
    labels = defaultdict(set)
    for e in entries:
        labels[e.version].add(e.variant)
    return [_Doc(v, encode(metadata_doc(ls)),
                 f"{project_dir(level_dir(commit))}/{variants_json_name(v)}")
            for v, ls in sorted(labels.items(), key=lambda kv: Version(kv[0]))]


def project_html(entries: list[WheelEntry], docs: list[_Doc], view_dir: str) -> bytes:
    lines = pages.project_html([], view_dir).decode().split("\n")  # the standard frame
    body = []
    body += [pages.wheel_anchor(e, _file_key(e), view_dir) for e in entries]
    for d in docs:
        name = posixpath.basename(d.key)
        body.append(f'<a href="{html.escape(href(d.key, view_dir))}#sha256={d.sha256}">'
                    f"{html.escape(name)}</a><br/>")
    at = lines.index("</body>")
    return "\n".join(lines[:at] + body + lines[at:]).encode()


def project_json(entries: list[WheelEntry], docs: list[_Doc], view_dir: str) -> bytes:
    doc = json.loads(pages.project_json(entries, view_dir))
    for f, e in zip(doc["files"], entries):
        f["url"] = href(_file_key(e), view_dir)
    doc["files"] += [{"filename": posixpath.basename(d.key), "url": href(d.key, view_dir),
                      "hashes": {"sha256": d.sha256}, "size": len(d.data), "yanked": False}
                     for d in docs]
    return json.dumps(doc, indent=1).encode()


def level_metadata(entries: list[WheelEntry], view_dir: str, pointer: dict) -> bytes:
    """metadata.json: the wheels (variant = their label) for precompiled mode and bisect."""
    wheels = [{
        "package_name": PROJECT, "filename": e.filename, "version": e.version,
        "variant": e.variant, "python_tag": e.python_tag, "abi_tag": e.abi_tag,
        "platform_tag": e.platform_tag, "sha256": e.sha256, "size": e.size, "commit": e.commit,
        "path": url_path(posixpath.relpath(_file_key(e), view_dir)),
    } for e in entries]
    return json.dumps({**pointer, "level": VARIANTS, "wheels": wheels}, indent=1,
                      sort_keys=True).encode()


def _write_if_changed(storage, key: str, data: bytes, written: list[str]) -> None:
    if storage.read(key) != data:
        storage.write_atomic(key, data)
        written.append(key)


def render(storage, view_dir: str, commit: str, pointer: dict, written: list[str],
           keep=lambda e: True) -> None:
    """Write variants.json files, then the view's pages, from the stored entries;
    again until what was rendered is what is stored."""
    entries = [e for e in _entries(storage, commit) if keep(e)]
    for _ in range(CONVERGE_ATTEMPTS):
        docs = _docs(commit, entries)
        for d in docs:
            _write_if_changed(storage, d.key, d.data, written)
        proj = project_dir(view_dir)
        page = project_html(entries, docs, view_dir)
        _write_if_changed(storage, f"{proj}/index.html", page, written)
        _write_if_changed(storage, f"{proj}/index.json", project_json(entries, docs, view_dir),
                          written)
        _write_if_changed(storage, f"{view_dir}/index.html", pages.root_html(), written)
        _write_if_changed(storage, f"{view_dir}/index.json", pages.root_json(), written)
        if storage.dir_keys:
            _write_if_changed(storage, f"{proj}/", page, written)
            _write_if_changed(storage, f"{view_dir}/", pages.root_html(), written)
        _write_if_changed(storage, f"{view_dir}/metadata.json",
                          level_metadata(entries, view_dir, pointer), written)
        now = [e for e in _entries(storage, commit) if keep(e)]
        if now == entries:
            return
        entries = now
    raise UserError(f"{view_dir}: the stored variant wheels kept changing while its pages were "
                    "written; run the publish again")


@dataclass
class Prepared:
    """Variant wheels made (in a temporary folder) before anything is stored."""
    commit: str
    made: list[tuple[InspectedWheel, Path, str]]  # (source, variant wheel, sha256)
    tmp: tempfile.TemporaryDirectory

    def close(self) -> None:
        self.tmp.cleanup()


def prepare(storage, commit: str, wheels: list[InspectedWheel], force: bool, log) -> Prepared:
    """Make every variant wheel and refuse conflicts, writing nothing to the index."""
    tmp = tempfile.TemporaryDirectory(prefix="variant-wheels-")
    made = []
    try:
        for w in wheels:
            if properties(w.variant) is None:
                log(f"{w.filename}: no variant wheel for {w.variant} (uv has no provider that "
                    "detects it); it stays on its per-variant level only")
                continue
            path = make_variant_wheel(w, Path(tmp.name))
            sha = sha256_file(path)
            old = storage.read(f"{project_dir(level_dir(commit))}/{path.name}{ENTRY_SUFFIX}")
            if old is not None and WheelEntry.from_json(old).sha256 != sha and not force:
                raise UserError(f"{project_dir(level_dir(commit))}/{path.name} is already "
                                "published with different bytes; a published wheel never "
                                "changes. Use --force to replace it.")
            made.append((w, path, sha))
    except BaseException:
        tmp.cleanup()
        raise
    return Prepared(commit, made, tmp)


def _store(storage, w: InspectedWheel, path: Path, sha: str, commit: str, when: int,
           log, result) -> None:
    proj = project_dir(level_dir(commit))
    key = f"{proj}/{path.name}"
    old = storage.read(key + ENTRY_SUFFIX)
    if old is not None and WheelEntry.from_json(old).sha256 == sha:
        result.unchanged.append(path.name)
        return
    if old is not None:
        log(f"--force: replacing {key}")
    with zipfile.ZipFile(path) as zf:
        metadata = zf.read(next(n for n in zf.namelist()
                                if n.endswith(".dist-info/METADATA") and n.count("/") == 1))
    entry = WheelEntry(
        filename=path.name, name=PROJECT, version=base_version(w.version),
        variant=w.variant, python_tag=w.tags[0], abi_tag=w.tags[1], platform_tag=w.tags[2],
        sha256=sha, size=path.stat().st_size,
        metadata_sha256=hashlib.sha256(metadata).hexdigest(), requires_python=w.requires_python,
        upload_time=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        commit=commit, commit_time=when)
    storage.upload_file(key, path)
    storage.write_atomic(key + METADATA_SUFFIX, metadata)
    storage.write_atomic(key + ENTRY_SUFFIX, entry.to_json())
    result.stored.append(path.name)


def publish(storage, prepared: Prepared, when: int, *, nightly: bool, release_version: str | None,
            allow_rewind: bool, log, result) -> None:
    """Store the prepared variant wheels, then write the commit's variants level
    and, when asked, nightly/variants and <version>/variants."""
    from wheel_index.publish import _nightly_may_move

    commit = prepared.commit
    try:
        if not prepared.made:
            return
        for w, path, sha in prepared.made:
            _store(storage, w, path, sha, commit, when, log, result)
    finally:
        prepared.close()
    pointer = {"project": PROJECT, "commit": commit, "commit_time": when, "variant": VARIANTS}
    view = level_dir(commit)
    render(storage, view, commit, {**pointer, "view": view}, result.pages_written)
    if nightly:
        view = f"{NIGHTLY}/{VARIANTS}"
        moved = _nightly_may_move(storage, view, commit, when, allow_rewind, log)
        result.nightly_moved[VARIANTS] = moved
        if moved:
            render(storage, view, commit, {**pointer, "view": view}, result.pages_written)
    if release_version:
        view = f"{release_version}/{VARIANTS}"
        render(storage, view, commit, {**pointer, "view": view, "release": release_version},
               result.pages_written,
               keep=lambda e: Version(e.version).public == release_version)
