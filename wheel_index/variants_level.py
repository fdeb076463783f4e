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
from wheel_index.layout import (
    ENTRY_SUFFIX,
    METADATA_SUFFIX,
    PROJECT,
    VARIANTS_LEVEL,
    href,
    level_dir,
    project_dir,
    url_path,
)
from wheel_index.levels import Pages, entry_key
from wheel_index.variant_wheels import (
    base_version,
    encode,
    make_variant_wheel,
    metadata_doc,
    properties,
    variants_json_name,
)
from wheel_index.wheels import InspectedWheel, WheelEntry


def _project(commit: str) -> str:
    """Where a commit's variant wheels and variants.json files are stored."""
    return project_dir(level_dir(commit, VARIANTS_LEVEL))


def _file_key(e: WheelEntry) -> str:
    return f"{_project(e.commit)}/{e.filename}"


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
                 f"{_project(commit)}/{variants_json_name(v)}")
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
    return json.dumps({**pointer, "level": VARIANTS_LEVEL, "wheels": wheels}, indent=1,
                      sort_keys=True).encode()


@dataclass(frozen=True)
class VariantsLevel:
    commit: str
    name = VARIANTS_LEVEL
    default = False  # never the top-level view: that is the main CUDA variant's
    what = "variant wheels"

    def pages(self, entries: list[WheelEntry], view_dir: str, pointer: dict) -> Pages:
        """The variants.json files go first: the pages carry their hashes."""
        docs = _docs(self.commit, entries)
        return Pages(project_html(entries, docs, view_dir), project_json(entries, docs, view_dir),
                     level_metadata(entries, view_dir, pointer),
                     tuple((d.key, d.data) for d in docs))


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
            old = storage.read(entry_key(commit, VARIANTS_LEVEL, path.name))
            if old is not None and WheelEntry.from_json(old).sha256 != sha and not force:
                raise UserError(f"{_project(commit)}/{path.name} is already "
                                "published with different bytes; a published wheel never "
                                "changes. Use --force to replace it.")
            made.append((w, path, sha))
    except BaseException:
        tmp.cleanup()
        raise
    return Prepared(commit, made, tmp)


def _store(storage, w: InspectedWheel, path: Path, sha: str, commit: str, when: int,
           log, result) -> None:
    proj = _project(commit)
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


def store(storage, prepared: Prepared, when: int, log, result) -> bool:
    """Store the prepared variant wheels; False when there were none to make
    (then the commit has no variants level to show)."""
    try:
        for w, path, sha in prepared.made:
            _store(storage, w, path, sha, prepared.commit, when, log, result)
    finally:
        prepared.close()
    return bool(prepared.made)
