"""Intel OpenMP (wheel installs) and TCMalloc (source builds) belong in
LD_PRELOAD on CPU; find them where they are installed and say how."""
from __future__ import annotations

import json
import logging
import os
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

logger = logging.getLogger("engine")

IOMP = "libiomp5.so"
TCMALLOC = "libtcmalloc_minimal.so.4"


def search_dirs() -> list[Path]:
    dirs = [Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"]
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += [Path(p) for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                               "/usr/lib64", "/usr/lib", "/usr/local/lib")]
    return dirs


def find(names=(IOMP, TCMALLOC), dirs: list[Path] | None = None) -> dict[str, Path]:
    found = {}
    for name in names:
        for d in dirs if dirs is not None else search_dirs():
            if (d / name).is_file():
                found[name] = d / name
                break
    return found


def is_source_build() -> bool:
    """An editable install is a source build; a wheel install is not."""
    try:
        text = metadata.distribution("vllm-engine").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return True
    return bool(text and json.loads(text).get("dir_info", {}).get("editable"))


def wanted(source_build: bool) -> tuple[str, ...]:
    return (IOMP, TCMALLOC) if source_build else (IOMP,)


def export_line(found: dict[str, Path], source_build: bool) -> str | None:
    libs = [str(found[n]) for n in wanted(source_build) if n in found]
    if not libs:
        return None
    return f"export LD_PRELOAD={':'.join(libs)}${{LD_PRELOAD:+:$LD_PRELOAD}}"


@lru_cache(maxsize=1)
def warn_if_not_preloaded() -> None:
    """Once per process: the libraries are installed but not in LD_PRELOAD."""
    source = is_source_build()
    found = find(wanted(source))
    preloaded = os.environ.get("LD_PRELOAD", "")
    missing = {n: p for n, p in found.items() if n not in preloaded}
    if missing:
        logger.warning("%s installed but not preloaded; for the best CPU performance run: %s",
                       ", ".join(missing), export_line(found, source))
