"""Starting a process with multiprocessing's spawn, as every process of the
engine starts (the engine core, API servers, -dp replicas, -tp ranks)."""
from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def main_not_rerun():
    """A spawned process re-runs the parent's __main__ script first (to find
    pickled functions); a rank needs nothing from it, and a script without an
    `if __name__ == "__main__"` guard would start an engine again in every
    rank. Hiding the script's path for the start skips that."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)
