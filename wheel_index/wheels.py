"""Inspect a wheel before it enters the index: refuse anything that is not a
well-formed vllm-engine wheel whose name, metadata and build info agree."""
from __future__ import annotations

import json
import re
import zipfile
import zlib
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path, PurePosixPath

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from tools.errors import UserError
from tools.variants import VARIANTS, main_cuda_variant
from wheel_index.documents import (
    TAG_RE,
    check_commit,
    check_sha256,
    parse_build_info,
    parse_core_metadata,
    parse_json_object,
)
from wheel_index.layout import PROJECT

BUILD_INFO = "engine/_build_info.json"
#: The wheel spec's file name, character by character: parse_wheel_filename
#: alone takes any character in a tag ('?', '#', a space), and such a name
#: becomes a key, a link and a metadata.json tag that verify, ls and prune refuse.
WHEEL_NAME_RE = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_.]*)?"
                           rf"(-{TAG_RE.pattern}){{3}}\.whl")  # tags: as metadata.json's


@dataclass(frozen=True)
class WheelEntry:
    """What the pages say about one stored wheel (stored as <wheel>.entry.json)."""

    filename: str
    name: str
    version: str
    variant: str
    python_tag: str
    abi_tag: str
    platform_tag: str
    sha256: str
    size: int
    metadata_sha256: str
    requires_python: str | None
    upload_time: str
    commit: str
    commit_time: int
    #: what the storage answered for the stored wheel (S3's ETag), so a quick
    #: verify sees a replaced object from a listing alone; None on a folder
    etag: str | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "entry record") -> WheelEntry:
        doc = parse_json_object(data, where)
        known = {f.name: f for f in fields(cls)}
        missing = [n for n, f in known.items() if n not in doc and f.default is MISSING]
        if missing:
            raise UserError(f"{where}: not an entry record (no {', '.join(missing[:5])})")
        # keyed by Field.type: the annotation's text here (postponed annotations)
        types: dict[str | type, tuple[type, ...]] = {
            "str": (str,), "int": (int,), "str | None": (str, type(None))}
        for name, f in known.items():
            if name in doc and not isinstance(doc[name], types.get(f.type, object)):
                raise UserError(f"{where}: {name} must be {f.type}, not "
                                f"{type(doc[name]).__name__}")
        check_sha256(doc["sha256"], where)
        check_sha256(doc["metadata_sha256"], where)
        check_commit(doc["commit"], where)
        try:
            Version(doc["version"])
        except InvalidVersion:
            raise UserError(f"{where}: version {doc['version'][:60]!r} is not valid") from None
        # fields a newer publisher added are left alone, not refused
        return cls(**{k: v for k, v in doc.items() if k in known})


def variant_of(version: Version) -> str:
    """The variant named by a version's local segment; a plain release is the
    default (main CUDA) variant."""
    if version.local is None:
        return main_cuda_variant().label
    label = version.local.split(".")[-1]
    if label not in VARIANTS:
        raise UserError(f"version {version} names no known variant in its local segment "
                        f"(expected it to end with one of: {', '.join(VARIANTS)})")
    return label


@dataclass(frozen=True)
class InspectedWheel:
    path: Path
    filename: str
    version: Version
    variant: str
    tags: tuple[str, str, str]
    metadata: bytes
    requires_python: str | None
    build_commit: str | None


def inspect_wheel(path: Path) -> InspectedWheel:
    path = Path(path)
    name = path.name
    where = str(path) if str(path).isprintable() else repr(str(path))  # one line, always
    if not path.is_file():
        raise UserError(f"{where}: no such file")
    if not name.endswith(".whl"):
        raise UserError(f"{where}: not a wheel (the file name does not end in .whl)")
    if any(c in name for c in "/\\") or name.startswith(".") or ".." in name:
        raise UserError(f"{where}: the file name must be a plain wheel name")
    if not WHEEL_NAME_RE.fullmatch(name):
        raise UserError(f"{where}: {name!r} is not a wheel file name as the wheel spec spells "
                        "it (name-version[-build]-python-abi-platform.whl of letters, digits, "
                        "'_' and '.', with '+' and '!' only in the version); rename the file")
    try:
        dist, version, _build, tags = parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise UserError(f"{where}: not a valid wheel file name ({exc})") from None
    if dist != canonicalize_name(PROJECT):
        raise UserError(f"{where}: a wheel of {dist!r}; this index holds only {PROJECT}")
    if len(tags) != 1:
        raise UserError(f"{where}: compressed tag sets are not supported; one tag per wheel")
    tag = next(iter(tags))
    # zipfile reports damage through many types (a bad CRC, an unsupported or
    # encrypted member, a truncated stream): every one is a corrupt wheel.
    unreadable = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, zlib.error,
                  NotImplementedError, RuntimeError, ValueError)
    try:
        zf = zipfile.ZipFile(path)
        bad = zf.testzip()
    except unreadable as exc:
        raise UserError(f"{where}: corrupt wheel (not a readable zip: {exc})") from None
    if bad is not None:
        raise UserError(f"{where}: corrupt wheel (member {bad!r} fails its CRC check)")
    with zf:
        members = zf.namelist()
        for m in members:
            p = PurePosixPath(m)
            if p.is_absolute() or ".." in p.parts or "\\" in m:
                raise UserError(f"{where}: unsafe member name {m!r} in the archive")
        metas = [m for m in members if m.count("/") == 1 and m.endswith(".dist-info/METADATA")]
        if len(metas) != 1:
            raise UserError(f"{where}: expected exactly one *.dist-info/METADATA, found "
                            f"{len(metas)}; not a valid wheel")
        try:
            metadata = zf.read(metas[0])
            info_bytes = zf.read(BUILD_INFO) if BUILD_INFO in members else None
        except unreadable as exc:
            raise UserError(f"{where}: corrupt wheel ({exc})") from None
    meta_name, meta_version, requires_python = parse_core_metadata(metadata,
                                                                   f"{where}: {metas[0]}")
    if canonicalize_name(meta_name) != dist or meta_version != version:
        raise UserError(
            f"{where}: the file name says {dist} {version} but its METADATA says "
            f"{meta_name} {meta_version}")
    variant = variant_of(version)
    build_info = parse_build_info(info_bytes, f"{where}: {BUILD_INFO}") if info_bytes else None
    compiled = build_info["variant"] if build_info else "empty"
    if compiled != variant:
        raise UserError(f"{where}: the version says variant {variant!r} but the wheel's build "
                        f"info ({BUILD_INFO}) says {compiled!r}; refusing a mislabelled wheel")
    commit = build_info.get("git_commit") if build_info else None
    return InspectedWheel(path, name, version, variant,
                          (tag.interpreter, tag.abi, tag.platform), metadata,
                          requires_python,
                          commit if commit and commit != "unknown" else None)


def normalized_version(v: Version) -> str:
    return canonicalize_version(v, strip_trailing_zero=False)
