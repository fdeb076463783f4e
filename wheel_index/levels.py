"""A level is one folder of a commit's wheels: a per-variant level
(``<commit>/<variant>``, wheel_index/per_variant_level.py) or the variants level
(``<commit>/variants``, wheel_index/variants_level.py). Both are shown the same
way, so publish drives any level through write_views: the commit's view,
then nightly and release views that link to the same stored files.

Pages are rendered from the entries actually stored and re-rendered until
stable, so that publishers of other variants or architectures of the same
commit, running at the same time, never drop each other's wheels.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from packaging.version import Version

from tools.errors import UserError
from wheel_index import pages
from wheel_index.layout import ENTRY_SUFFIX, NIGHTLY, PROJECT, level_dir, project_dir
from wheel_index.nightly import stays as nightly_stays
from wheel_index.storage import Storage
from wheel_index.wheels import WheelEntry

CONVERGE_ATTEMPTS = 8


class Pages(NamedTuple):
    """What one view of a level shows; files are written first (pages carry their hashes)."""
    project_html: bytes
    project_json: bytes
    metadata: bytes
    files: tuple[tuple[str, bytes], ...] = ()


class Level(Protocol):
    # Read-only members: a level may answer them with a frozen field or a property.
    @property
    def commit(self) -> str: ...

    @property
    def name(self) -> str:
        """The folder under <commit>/."""

    @property
    def default(self) -> bool:
        """Also shown without the folder: <commit>/, nightly/, <version>/."""

    @property
    def what(self) -> str:
        """What its wheels are called in messages."""

    def pages(self, entries: list[WheelEntry], view_dir: str, pointer: dict) -> Pages: ...


def entry_key(commit: str, level: str, filename: str) -> str:
    return f"{project_dir(level_dir(commit, level))}/{filename}{ENTRY_SUFFIX}"


def entries_in(storage: Storage, commit: str, level: str) -> list[WheelEntry]:
    prefix = project_dir(level_dir(commit, level))
    out = []
    for key in storage.list(prefix):
        if key.endswith(ENTRY_SUFFIX):
            data = storage.read(key)
            if data:
                out.append(WheelEntry.from_json(data, key))
    return sorted(out, key=lambda e: (Version(e.version), e.filename))


def write_if_changed(storage: Storage, key: str, data: bytes, written: list[str]) -> None:
    if storage.read(key) != data:
        storage.write_atomic(key, data)
        written.append(key)


def render(storage: Storage, level: Level, view_dir: str, pointer: dict, written: list[str],
           keep: Callable[[WheelEntry], bool] = lambda e: True) -> None:
    """Write a view's pages from the level's stored entries, and repeat until
    what was rendered is what is stored."""
    entries = [e for e in entries_in(storage, level.commit, level.name) if keep(e)]
    for _ in range(CONVERGE_ATTEMPTS):
        shown = level.pages(entries, view_dir, pointer)
        for key, data in shown.files:
            write_if_changed(storage, key, data, written)
        proj = project_dir(view_dir)
        write_if_changed(storage, f"{proj}/index.html", shown.project_html, written)
        write_if_changed(storage, f"{proj}/index.json", shown.project_json, written)
        prefix = f"{view_dir}/" if view_dir else ""
        write_if_changed(storage, f"{prefix}index.html", pages.root_html(), written)
        write_if_changed(storage, f"{prefix}index.json", pages.root_json(), written)
        if storage.dir_keys:
            write_if_changed(storage, f"{proj}/", shown.project_html, written)
            write_if_changed(storage, prefix, pages.root_html(), written)
        write_if_changed(storage, f"{prefix}metadata.json", shown.metadata, written)
        now = [e for e in entries_in(storage, level.commit, level.name) if keep(e)]
        if now == entries:
            return
        entries = now  # another publisher added a wheel meanwhile: render again
    raise UserError(f"{view_dir}: the stored {level.what} kept changing while its pages were "
                    "written; run the publish again")


def write_views(storage: Storage, level: Level, commit_time: int, *, nightly: bool,
                release_version: str | None, allow_rewind: bool, result) -> None:
    """The level's commit view; nightly's when it may move there; the release's
    (only the release's wheels) when publishing one."""
    pointer = {"project": PROJECT, "commit": level.commit, "commit_time": commit_time,
               "variant": level.name}

    def views(top: str) -> list[str]:
        return [f"{top}/{level.name}"] + ([top] if level.default else [])

    for view in views(level.commit):
        render(storage, level, view, {**pointer, "view": view}, result.pages_written)
    if nightly:
        nviews = views(NIGHTLY)
        why = nightly_stays(storage, nviews[0], level.commit, commit_time, allow_rewind)
        result.nightly_moved[level.name] = why is None
        if why:
            result.nightly_kept.setdefault(why, []).append(level.name)
        else:
            for view in nviews:
                render(storage, level, view, {**pointer, "view": view}, result.pages_written)
    if release_version:
        for view in views(release_version):
            render(storage, level, view, {**pointer, "view": view, "release": release_version},
                   result.pages_written,
                   keep=lambda e: Version(e.version).public == release_version)
