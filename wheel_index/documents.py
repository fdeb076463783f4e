"""Read what comes from outside the index code (metadata.json documents, a
wheel's build info and METADATA, `#sha256=` fragments) and check every field
where it enters, so that a malformed or hostile document ends in one UserError
naming it, never in a KeyError, a traceback or a path built from garbage."""
from __future__ import annotations

import json
import re
from email.parser import HeaderParser
from urllib.parse import unquote, urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from tools.errors import UserError
from tools.variants import VARIANTS
from wheel_index.layout import COMMIT_RE

SHA256_RE = re.compile(r"[0-9a-f]{64}")
TAG_RE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


def check_sha256(value: object, where: str) -> str:
    if not isinstance(value, str) or not SHA256_RE.fullmatch(value):
        raise UserError(f"{where}: sha256 {str(value)[:80]!r} is not 64 lowercase hex digits")
    return value


def check_commit(value: object, where: str) -> str:
    if not isinstance(value, str) or not COMMIT_RE.fullmatch(value):
        raise UserError(f"{where}: commit {str(value)[:80]!r} is not 40 lowercase hex digits")
    return value


def check_variant(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in VARIANTS:
        raise UserError(f"{where}: variant {str(value)[:40]!r} is not one of "
                        f"{', '.join(VARIANTS)}")
    return value


def parse_json_object(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise UserError(f"{where} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise UserError(f"{where}: expected a JSON object, found {type(doc).__name__}")
    return doc


def check_relative_url(value: object, where: str) -> str:
    """A percent-encoded relative link of the index: no scheme, no host, no
    query, no encoded '/', nothing that decodes to a control character or a
    backslash."""
    if not isinstance(value, str) or not value:
        raise UserError(f"{where}: path must be a non-empty string")
    parts = urlsplit(value)
    decoded = unquote(value)
    if (parts.scheme or parts.netloc or parts.query or parts.fragment or value.startswith("/")
            or "\\" in decoded or any(ord(c) < 32 or ord(c) == 127 for c in decoded)
            or any("/" in unquote(seg) for seg in value.split("/"))):
        raise UserError(f"{where}: path {value[:120]!r} is not a plain relative link")
    return value


def parse_metadata_json(data: bytes, where: str) -> dict:
    """A view's metadata.json: its commit and the wheels it lists, each checked."""
    doc = parse_json_object(data, where)
    check_commit(doc.get("commit"), where)
    wheels = doc.get("wheels")
    if not isinstance(wheels, list):
        raise UserError(f"{where}: 'wheels' must be a list")
    for i, w in enumerate(wheels):
        at = f"{where}: wheels[{i}]"
        if not isinstance(w, dict):
            raise UserError(f"{at} is not an object")
        name = w.get("filename")
        if not isinstance(name, str) or not name.endswith(".whl") or "/" in name or \
                "\\" in name or name.startswith("."):
            raise UserError(f"{at}: filename {str(name)[:120]!r} is not a plain wheel name")
        path = check_relative_url(w.get("path"), at)
        if unquote(path.rsplit("/", 1)[-1]) != name:
            raise UserError(f"{at}: path {path[:120]!r} does not end in its filename {name!r}")
        check_sha256(w.get("sha256"), at)
        check_variant(w.get("variant"), at)
        check_commit(w.get("commit"), at)
        for key in ("python_tag", "abi_tag", "platform_tag"):
            if not isinstance(w.get(key), str) or not TAG_RE.fullmatch(w[key]):
                raise UserError(f"{at}: {key} {str(w.get(key))[:60]!r} is not a wheel tag")
        if not isinstance(w.get("size"), int) or isinstance(w["size"], bool) or w["size"] < 0:
            raise UserError(f"{at}: size must be a non-negative integer")
    return doc


def parse_build_info(data: bytes, where: str) -> dict:
    """engine/_build_info.json of a wheel: its variant, and the commit and torch
    requirement when given."""
    doc = parse_json_object(data, where)
    variant = doc.get("variant")
    if variant != "empty":
        check_variant(variant, where)
    commit = doc.get("git_commit")
    if commit is not None and commit != "unknown":
        check_commit(commit, where)
    req = doc.get("torch_requirement")
    if req is not None and (not isinstance(req, str) or not req.strip()):
        raise UserError(f"{where}: torch_requirement must be a non-empty string")
    return doc


def parse_core_metadata(data: bytes, where: str) -> tuple[str, Version, str | None]:
    """(Name, Version, Requires-Python) of a wheel's METADATA, each checked."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: METADATA is not UTF-8") from None
    headers = HeaderParser().parsestr(text)
    name, raw_version, requires = (headers.get("Name"), headers.get("Version"),
                                   headers.get("Requires-Python"))
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"{where}: METADATA has no Name")
    try:
        version = Version(str(raw_version or ""))
    except InvalidVersion:
        raise UserError(f"{where}: METADATA Version {str(raw_version)[:60]!r} is not a valid "
                        "version") from None
    if requires is not None:
        try:
            SpecifierSet(str(requires))
        except InvalidSpecifier:
            raise UserError(f"{where}: METADATA Requires-Python {str(requires)[:60]!r} is not a "
                            "valid specifier") from None
        requires = str(requires)
    return str(name), version, requires
