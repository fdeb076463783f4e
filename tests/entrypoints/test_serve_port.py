"""`engine serve` on a port that is taken: one line naming it and `--port`,
exit 1, before the model is looked at (loading takes minutes on a big one)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from helpers import REPO


@pytest.mark.slow  # a Python start with the engine imported: ~20 s on a busy machine
def test_a_busy_port_fails_before_the_model_loads(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # a model that does not exist: had it been looked at first, its error would come
        res = subprocess.run([sys.executable, "-m", "engine.cli", "serve",
                              str(tmp_path / "no-such-model"), "--port", str(port)],
                             env=env, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "Traceback" not in out and res.stderr.count("\n") == 1, out
    assert f"127.0.0.1:{port}" in res.stderr and "--port" in res.stderr, out
    assert "address already in use" in res.stderr, out


@pytest.mark.slow  # loads the tiny model in an engine core: ~20 s
def test_a_failure_after_the_core_started_does_not_leave_it_running(tmp_path):
    """Anything that breaks between the core's handshake and uvicorn's start
    (here build_app) stops the core: the interpreter's exit waits for its
    children, and a core left waiting for requests hung the server for good."""
    from engine.cli import main

    model = tmp_path / "tiny"
    assert main(["make-tiny-model", str(model)]) == 0
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    script = (
        "import sys\n"
        "import engine.entrypoints.openai.api_server as a\n"
        "def broken(*args, **kwargs): raise RuntimeError('broken on purpose')\n"
        "a.build_app = broken\n"
        "from engine.cli import main\n"
        f"sys.exit(main(['serve', {str(model)!r}, '--port', '0']))\n")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=150)
    assert res.returncode != 0 and "broken on purpose" in res.stderr, res.stderr[-3000:]
