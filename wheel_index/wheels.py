"""Inspect a wheel before it enters the index: refuse anything that is not a
well-formed vllm-engine wheel whose name, metadata and build info agree."""
from __future__ import annotations

import json
import zipfile
from dataclasses import asdict, dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)
from packaging.version import Version

from tools.errors import UserError
from tools.variants import VARIANTS, main_cuda_variant
from wheel_index.layout import PROJECT

BUILD_INFO = "engine/_build_info.json"


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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "WheelEntry":
        return cls(**json.loads(data))


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
    where = f"{path}"
    if not path.is_file():
        raise UserError(f"{where}: no such file")
    if not name.endswith(".whl"):
        raise UserError(f"{where}: not a wheel (the file name does not end in .whl)")
    if any(c in name for c in "/\\") or name.startswith(".") or ".." in name:
        raise UserError(f"{where}: the file name must be a plain wheel name")
    try:
        dist, version, _build, tags = parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise UserError(f"{where}: not a valid wheel file name ({exc})") from None
    if dist != canonicalize_name(PROJECT):
        raise UserError(f"{where}: a wheel of {dist!r}; this index holds only {PROJECT}")
    if len(tags) != 1:
        raise UserError(f"{where}: compressed tag sets are not supported; one tag per wheel")
    tag = next(iter(tags))
    try:
        zf = zipfile.ZipFile(path)
        bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
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
        metadata = zf.read(metas[0])
        build_info = json.loads(zf.read(BUILD_INFO)) if BUILD_INFO in members else None
    headers = HeaderParser().parsestr(metadata.decode("utf-8", "replace"))
    if canonicalize_name(headers.get("Name", "")) != dist or Version(
            headers.get("Version", "0")) != version:
        raise UserError(
            f"{where}: the file name says {dist} {version} but its METADATA says "
            f"{headers.get('Name')} {headers.get('Version')}")
    variant = variant_of(version)
    compiled = build_info["variant"] if build_info else "empty"
    if compiled != variant:
        raise UserError(f"{where}: the version says variant {variant!r} but the wheel's build "
                        f"info ({BUILD_INFO}) says {compiled!r}; refusing a mislabelled wheel")
    commit = build_info.get("git_commit") if build_info else None
    return InspectedWheel(path, name, version, variant,
                          (tag.interpreter, tag.abi, tag.platform), metadata,
                          headers.get("Requires-Python"),
                          commit if commit and commit != "unknown" else None)


def normalized_version(v: Version) -> str:
    return canonicalize_version(v, strip_trailing_zero=False)
