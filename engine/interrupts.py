"""Ctrl-C that no library can swallow.

Python's own SIGINT handler raises KeyboardInterrupt where the main thread
is, and C code can clear it: torch's import initialises NumPy from C and drops
an exception raised meanwhile, so a Ctrl-C in that second was lost and the
server went on to load the model. The handler here records the signal and
raises; if the command has not ended or taken the signal over (take_over)
within GRACE_S, a watchdog ends the process with the shell's status for it."""
from __future__ import annotations

import os
import signal
import sys
import threading

GRACE_S = 1.0
received: list[int] = []
_watchdog: threading.Timer | None = None


def _exit_now(command: str) -> None:
    print(f"engine {command}: interrupted", file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGINT)


def install(command: str = ""):
    """Install the handler; returns the one it replaces (to restore), or None
    off the main thread, where Python lets no one set a handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    def record_and_raise(signum, frame) -> None:
        global _watchdog
        received.append(signum)
        if _watchdog is None:
            _watchdog = threading.Timer(GRACE_S, _exit_now, (command,))
            _watchdog.daemon = True
            _watchdog.start()
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, record_and_raise)


def take_over() -> list[int]:
    """For a command that now handles SIGINT itself (or has ended): the
    signals seen so far (one a library swallowed among them); no watchdog."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.cancel()
        _watchdog = None
    seen = list(received)
    received.clear()
    return seen
