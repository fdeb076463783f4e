"""Take only the compiled artefacts out of a wheel, safely.

Every member name of the archive is checked (no absolute paths, no '..', no
links) before anything is written; each file is written under a temporary name
and renamed, so an interrupted install never leaves a half-written .so.
"""
from __future__ import annotations

import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from tools.atomic import write_atomic
from tools.errors import UserError
from wheel_index.documents import parse_build_info

BUILD_INFO = "_build_info.json"
RECORD = "_precompiled.json"


def _take(name: str) -> bool:
    p = PurePosixPath(name)
    return len(p.parts) == 2 and p.parts[0] == "engine" and (
        p.suffix == ".so" or p.name == BUILD_INFO)


def check_members(zf: zipfile.ZipFile, where: str) -> None:
    for info in zf.infolist():
        p = PurePosixPath(info.filename)
        if (p.is_absolute() or ".." in p.parts or "\\" in info.filename
                or info.filename.startswith("/")):
            raise UserError(f"{where}: refusing unsafe member name {info.filename!r}")
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise UserError(f"{where}: refusing link member {info.filename!r}")


def extract_kernels(wheel: Path, package_dir: Path, variant: str, torch_requirement: str,
                    extra: dict[str, bytes] | None = None) -> list[Path]:
    """Check, then write engine/*.so and the build info into package_dir.
    torch_requirement is the pin this install gets ("torch" when unpinned);
    the wheel's kernels must have been built for it."""
    where = str(wheel)
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"{where}: not a readable wheel ({exc})") from None
    with zf:
        check_members(zf, where)
        names = [n for n in zf.namelist() if _take(n)]
        if f"engine/{BUILD_INFO}" not in names or not any(n.endswith(".so") for n in names):
            raise UserError(f"{where}: has no compiled kernels (engine/*.so and "
                            f"engine/{BUILD_INFO}); it cannot serve precompiled mode")
        try:
            info = parse_build_info(zf.read(f"engine/{BUILD_INFO}"),
                                    f"{where}: engine/{BUILD_INFO}")
            payload = {PurePosixPath(n).name: zf.read(n) for n in names}  # all read, CRC-checked
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError,
                RuntimeError) as exc:
            raise UserError(f"{where}: corrupt wheel ({exc}); nothing was written") from None
        if info.get("variant") != variant:
            raise UserError(f"{where} holds {info.get('variant')!r} kernels, not {variant!r}; "
                            "a wheel of another variant is never used")
        built_for = info.get("torch_requirement")
        if torch_requirement != "torch" and built_for and built_for != torch_requirement:
            raise UserError(f"{where} was built for {built_for}, but this install gets "
                            f"{torch_requirement}; its kernels would not load. Build from "
                            "source or choose another commit.")
    payload.update(extra or {})
    package_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in sorted(payload.items(), key=lambda kv: kv[0].endswith(".so")):
        dest = package_dir / name
        write_atomic(dest, data, mode=0o755 if name.endswith(".so") else 0o644)
        written.append(dest)
    return written
