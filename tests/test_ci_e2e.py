"""The ci/ scripts and pipeline definitions, run as CI and a laptop run them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, UV, run, torch_wheelhouse

WORKFLOW = REPO / ".github" / "workflows" / "wheels.yml"


def test_github_workflow_is_valid_for_its_schema():
    res = run([Path(sys.executable).parent / "check-jsonschema", "--builtin-schema",
               "vendor.github-workflows", WORKFLOW], check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    text = WORKFLOW.read_text()
    for variant in ("cpu", "cu129", "cu130", "rocm700", "xpu"):
        assert f"variant: {variant}," in text
    assert "arch: aarch64" in text
    for script in ("ci/setup-dev.sh", "ci/build-wheel.sh", "ci/smoke-test.sh", "ci/publish.sh"):
        assert script in text and (REPO / script).is_file()


def _env():
    return {"PYTHON": sys.executable, "UV": UV, "VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse())}


@pytest.mark.slow
def test_nightly_local_on_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", REPO, clone])
    index = tmp_path / "index"
    res = run(["bash", clone / "ci" / "nightly-local.sh", "--index", index, "--variants", "cpu"],
              env=_env(), cwd=clone)
    assert "installed from the index and ran:" in res.stdout
    assert (index / "nightly" / "cpu" / "vllm-engine" / "index.html").is_file()
    res = run([sys.executable, "-m", "wheel_index", "verify", "--index", index], cwd=REPO,
              check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("0 problem(s) in "), res.stdout


@pytest.mark.slow
def test_failed_smoke_test_publishes_nothing(tmp_path):
    index = tmp_path / "index"
    # An import that fails (an invalid run-time setting) fails the smoke test.
    res = subprocess.run(["bash", REPO / "ci" / "pipeline.sh", "cpu", "--index", str(index)],
                         env={**__import__("os").environ, **_env(), "VLLM_CPU_ISA": "sse"},
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode != 0
    assert "VLLM_CPU_ISA='sse' is not valid" in res.stderr + res.stdout
    assert not index.exists() or not any(index.rglob("*.whl"))
