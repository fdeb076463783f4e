"""Process-wide logging set-up, one place for every process the engine starts."""
from __future__ import annotations

import logging
from typing import IO

# torch logs at INFO too (its FakeTensor cache statistics at exit, say): noise in
# an engine's log, and after "interrupted" it reads as if something ran on.
_QUIET = ("torch",)


def init_logging(level: int, fmt: str, stream: IO[str] | None = None) -> None:
    logging.basicConfig(level=level, format=fmt, stream=stream)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
