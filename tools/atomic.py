"""Write a file so that a reader (or a crash) sees the old bytes or the new ones,
never a part: a temporary file in the same folder, synced, then renamed."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(dest: Path, content: bytes | Callable[[BinaryIO], object], *,
                 mode: int = 0o644, prefix: str | None = None) -> None:
    """content: the bytes, or a function that writes them to the open file.
    prefix names the temporary file (listings skip it); default `.<name>.`."""
    fd, tmp = tempfile.mkstemp(prefix=prefix or f".{dest.name}.", suffix=".tmp",
                               dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(content, bytes):
                f.write(content)
            else:
                content(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
