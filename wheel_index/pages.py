"""Render one view of a set of wheels: a PEP 503 project page (with sha256,
requires-python and PEP 658/714 metadata attributes), its PEP 691 JSON twin,
the view's root page, and the metadata.json that precompiled mode reads."""
from __future__ import annotations

import html
import json

from packaging.version import Version

from wheel_index.layout import PROJECT, href, url_path
from wheel_index.wheels import WheelEntry

API_VERSION = "1.1"


def project_html(entries: list[WheelEntry], view_dir: str) -> bytes:
    lines = ["<!DOCTYPE html>", "<html>", "<head><meta name=\"pypi:repository-version\" "
             f"content=\"{API_VERSION}\"><title>Links for {PROJECT}</title></head>", "<body>",
             f"<h1>Links for {PROJECT}</h1>"]
    lines += [wheel_anchor(e, _file_key(e), view_dir) for e in entries]
    lines += ["</body>", "</html>", ""]
    return "\n".join(lines).encode()


def wheel_anchor(e: WheelEntry, file_key: str, view_dir: str) -> str:
    """One wheel's PEP 503 link: hash, Requires-Python and PEP 658/714 metadata hashes."""
    attrs = [f'href="{html.escape(href(file_key, view_dir))}#sha256={e.sha256}"']
    if e.requires_python:
        attrs.append(f'data-requires-python="{html.escape(e.requires_python)}"')
    attrs.append(f'data-core-metadata="sha256={e.metadata_sha256}"')
    attrs.append(f'data-dist-info-metadata="sha256={e.metadata_sha256}"')
    return f"<a {' '.join(attrs)}>{html.escape(e.filename)}</a><br/>"


def project_json(entries: list[WheelEntry], view_dir: str) -> bytes:
    versions = sorted({e.version for e in entries}, key=Version)
    files = [{
        "filename": e.filename,
        "url": href(_file_key(e), view_dir),
        "hashes": {"sha256": e.sha256},
        "requires-python": e.requires_python,
        "core-metadata": {"sha256": e.metadata_sha256},
        "dist-info-metadata": {"sha256": e.metadata_sha256},
        "size": e.size,
        "upload-time": e.upload_time,
        "yanked": False,
    } for e in entries]
    doc = {"meta": {"api-version": API_VERSION}, "name": PROJECT, "versions": versions,
           "files": files}
    return json.dumps(doc, indent=1).encode()


def root_html() -> bytes:
    return (f"<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content="
            f"\"{API_VERSION}\"></head><body>\n<a href=\"{PROJECT}/\">{PROJECT}</a>\n"
            "</body></html>\n").encode()


def root_json() -> bytes:
    return json.dumps({"meta": {"api-version": API_VERSION},
                       "projects": [{"name": PROJECT}]}).encode()


def level_metadata(entries: list[WheelEntry], view_dir: str, pointer: dict) -> bytes:
    """metadata.json of a view: the wheels, with percent-encoded paths relative
    to the view's folder."""
    import posixpath

    wheels = [{
        "package_name": PROJECT,
        "filename": e.filename,
        "version": e.version,
        "variant": e.variant,
        "python_tag": e.python_tag,
        "abi_tag": e.abi_tag,
        "platform_tag": e.platform_tag,
        "path": url_path(posixpath.relpath(_file_key(e), view_dir or ".")),
        "sha256": e.sha256,
        "size": e.size,
        "commit": e.commit,
    } for e in entries]
    return json.dumps({**pointer, "wheels": wheels}, indent=1, sort_keys=True).encode()


def _file_key(e: WheelEntry) -> str:
    return f"{e.commit}/{e.variant}/{PROJECT}/{e.filename}"
