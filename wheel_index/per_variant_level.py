"""The per-variant level: ``<commit>/<variant>/``, the wheels of one variant
as built (wheel_index/layout.py), each stored once and never changed."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone

from tools.errors import UserError
from tools.variants import is_default_variant
from wheel_index import pages
from wheel_index.layout import METADATA_SUFFIX, PROJECT, level_dir, project_dir
from wheel_index.levels import Pages, entry_key
from wheel_index.storage import Storage
from wheel_index.wheels import InspectedWheel, WheelEntry


@dataclass(frozen=True)
class PerVariantLevel:
    commit: str
    name: str  # the variant label
    what = "wheels"

    @property
    def default(self) -> bool:
        return is_default_variant(self.name)

    def pages(self, entries: list[WheelEntry], view_dir: str, pointer: dict) -> Pages:
        return Pages(pages.project_html(entries, view_dir), pages.project_json(entries, view_dir),
                     pages.level_metadata(entries, view_dir, pointer))


def published(storage: Storage, w: InspectedWheel, commit: str, sha: str,
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


def store(storage: Storage, w: InspectedWheel, sha: str, commit: str, commit_time: int,
          force: bool, log, result) -> None:
    """Wheel, then .metadata, then the entry pages are rendered from: a killed
    publish leaves no entry pointing at a missing file."""
    proj = project_dir(level_dir(commit, w.variant))
    old = published(storage, w, commit, sha, force)
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
