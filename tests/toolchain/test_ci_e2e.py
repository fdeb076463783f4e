"""The ci/ scripts and pipeline definitions, run as CI and a laptop run them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, UV, run, torch_wheelhouse


def _env():
    return {"PYTHON": sys.executable, "UV": UV, "VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse())}


@pytest.mark.slow
def test_nightly_local_on_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", REPO, clone])
    index = tmp_path / "index"
    # Publish as main does (nightly moves) even when this checkout is on another branch.
    res = run(["bash", clone / "ci" / "nightly-local.sh", "--index", index, "--variants", "cpu"],
              env={**_env(), "GITHUB_REF": "refs/heads/main"}, cwd=clone)
    assert "installed from the index and ran:" in res.stdout
    assert (index / "nightly" / "cpu" / "vllm-engine" / "index.html").is_file()
    res = run([sys.executable, "-m", "wheel_index", "verify", "--index", index], cwd=REPO,
              check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("0 problem(s) in "), res.stdout

    # the same commit again: the wheel rebuilds byte-identical, so publishing is a no-op
    res = run(["bash", clone / "ci" / "nightly-local.sh", "--index", index, "--variants", "cpu"],
              env={**_env(), "GITHUB_REF": "refs/heads/main"}, cwd=clone)
    assert "unchanged vllm_engine-" in res.stdout and "stored    " not in res.stdout, res.stdout
    assert "wheel_index serve --index" in res.stdout.splitlines()[-2]  # how to serve it again


def test_nightly_local_takes_force():
    res = subprocess.run(["bash", REPO / "ci" / "nightly-local.sh", "--force", "--no-such"],
                         env={**__import__("os").environ, **_env()}, capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 2 and res.stderr.strip() == "unknown argument --no-such", res.stderr


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


@pytest.mark.slow
def test_python_only_commit_reuses_the_kernels(tmp_path):
    """A kernel commit compiles and publishes; a Python-only commit on top makes
    its wheel from those kernels (ci/build-wheel.sh with VLLM_WHEEL_INDEX) and
    the index accepts it under the new commit. The same run as benchmarks/ci.py."""
    import json
    import zipfile

    from benchmarks.ci import measure, precompiled_record

    r = measure(tmp_path)
    assert "reusing kernels from" not in r.kernel.log
    assert "reusing kernels from" in r.python_only.log, r.python_only.log[-3000:]
    record = precompiled_record(r.python_only.wheel)
    assert record and f"{r.kernel_commit}/cpu/" in record["source"]
    assert precompiled_record(r.kernel.wheel) is None

    def info(wheel):
        with zipfile.ZipFile(wheel) as zf:
            return json.loads(zf.read("engine/_build_info.json")), zf.namelist()

    (k_info, _), (p_info, p_names) = info(r.kernel.wheel), info(r.python_only.wheel)
    assert p_info["git_commit"] == k_info["git_commit"] == r.kernel_commit
    assert p_info["kernel_fingerprint"] == k_info["kernel_fingerprint"]
    assert "engine/_ci_benchmark.py" in p_names  # the new commit's Python is in it
    assert f"+g{r.python_commit[:9]}" in r.python_only.wheel.name
    assert "manylinux" in r.python_only.wheel.name
    meta = json.loads((r.index / r.python_commit / "cpu" / "metadata.json").read_text())
    assert meta["wheels"][0]["filename"] == r.python_only.wheel.name
    nightly = json.loads((r.index / "nightly" / "cpu" / "metadata.json").read_text())
    assert nightly["commit"] == r.python_commit
