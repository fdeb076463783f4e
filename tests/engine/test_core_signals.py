"""The engine core's SIGTERM handler (engine.core.engine_core_proc)."""
from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from engine.core.engine_core_proc import _exit_on_signal


def test_sigterm_ends_the_core_from_ordinary_code():
    with pytest.raises(SystemExit) as exc:
        _exit_on_signal(signal.SIGTERM, sys._getframe())
    assert exc.value.code == 0


def test_sigterm_inside_a_finalizer_is_sent_again_not_lost(monkeypatch):
    """Raised inside __del__, SystemExit would be printed as "ignored" and the
    core would run on: the handler sends the signal again instead."""
    sent = threading.Event()
    got: list[tuple[int, int]] = []

    def kill(pid, sig):
        got.append((pid, sig))
        sent.set()

    monkeypatch.setattr(os, "kill", kill)

    class Finalized:
        def __del__(self):
            _exit_on_signal(signal.SIGTERM, sys._getframe())  # must not raise here

    Finalized()
    assert sent.wait(5)
    assert got == [(os.getpid(), signal.SIGTERM)]
