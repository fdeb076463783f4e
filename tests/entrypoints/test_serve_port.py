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
