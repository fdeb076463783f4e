"""End to end with the real uv 0.13 and pip: the variants level served on
127.0.0.1 gives this machine the cpu build (PEP 825's null variant, label `null`), a faked NVIDIA driver the matching
CUDA build, and pip (no variant support) nothing at all."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from helpers import REPO, UV, make_venv, make_wheel, run, torch_wheelhouse

from wheel_index.publish import publish
from wheel_index.server import make_server
from wheel_index.storage import open_storage
from wheel_index.variant_wheels import UV_PREVIEW

pytestmark = pytest.mark.slow

SMOKE = ("import torch, engine; from engine.build_info import build_info; x = torch.randn(2, 32); "
         "o = torch.empty_like(x); engine.ops.rms_norm(o, x, torch.ones(32), 1e-6); "
         "print(build_info().variant, engine.__version__)")
#: The CUDA version each driver ships. uv 0.13.9's vendored NVIDIA provider
#: reads the CUDA (user-mode) version from the driver library, or from
#: NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION; UV_CUDA_DRIVER_VERSION (the
#: kernel driver version) only feeds --torch-backend. Both are set.
DRIVERS = {"580.65.06": ("13.0", "cu130"), "525.60.13": ("12.0", "cu129")}


def _serve(root: Path):
    server = make_server(root)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _no_gpu_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("UV_CUDA_DRIVER_VERSION", "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION")}
    env["UV_CACHE_DIR"] = str(tmp_path / "uv-cache")  # provider answers are not reused
    return env


@pytest.fixture(scope="module")
def cpu_variants_level(cpu_wheel, tmp_path_factory):
    info = json.loads(zipfile.ZipFile(cpu_wheel).read("engine/_build_info.json"))
    idx = tmp_path_factory.mktemp("index")
    publish(open_storage(str(idx)), info["git_commit"], [cpu_wheel], commit_time="1000",
            log=lambda m: None)
    server, url = _serve(idx)
    yield f"{url}/{info['git_commit']}/variants", cpu_wheel
    server.shutdown()
    server.server_close()


def test_uv_installs_the_cpu_variant_here_and_it_imports(cpu_variants_level, tmp_path):
    level, wheel = cpu_variants_level
    py = make_venv(tmp_path / "venv")
    # The README's one command, with torch from the local wheelhouse instead of
    # --torch-backend auto (PyTorch's index is unreachable here); --index puts the
    # variants level before PyPI, which still serves torch's own dependencies.
    proc = subprocess.run(
        [UV, "pip", "install", "--python", py, *UV_PREVIEW, "vllm-engine", "--index", level,
         "--find-links", torch_wheelhouse()],
        env=_no_gpu_env(tmp_path), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = run([py, "-c", SMOKE], cwd=tmp_path).stdout
    assert out.split() == ["cpu", wheel.name.split("-")[1].rsplit(".", 1)[0]]
    dist_info = next((tmp_path / "venv" / "lib").glob("python*/site-packages/vllm_engine-*"))
    assert json.loads((dist_info / "variant.json").read_text())["variants"] == {"null": {}}
    assert "+" in dist_info.name and not dist_info.name.split("+")[1].startswith("cpu")


@pytest.fixture(scope="module")
def synthetic_level(tmp_path_factory):
    """Synthetic cpu, cu129 and cu130 wheels of one commit, each published by
    its own publisher, as CI's jobs do."""
    tmp = tmp_path_factory.mktemp("synthetic")
    idx, commit = tmp / "index", "d" * 40
    for v in ("cpu", "cu129", "cu130"):
        w = make_wheel(tmp / v, f"0.1.dev7+gfeed123.{v}", commit=commit)
        publish(open_storage(str(idx)), commit, [w], nightly=True, commit_time="100",
                log=lambda m: None)
    server, url = _serve(idx)
    yield url
    server.shutdown()
    server.server_close()


def _chosen(level: str, tmp_path: Path, env: dict) -> str:
    py = make_venv(tmp_path / f"venv{len(list(tmp_path.iterdir()))}")
    proc = subprocess.run([UV, "pip", "install", "--python", py, *UV_PREVIEW, "--dry-run", "-v",
                           "vllm-engine", "--index-url", level], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = re.findall(r"manylinux_2_34_x86_64-(\w+)\.whl", proc.stderr)
    assert found, proc.stderr[-4000:]
    return found[0]


@pytest.mark.parametrize("level", ["nightly/variants", "d" * 40 + "/variants"])
def test_dry_runs_pick_the_variant_the_driver_supports(synthetic_level, level, tmp_path):
    url = f"{synthetic_level}/{level}"
    assert _chosen(url, tmp_path, _no_gpu_env(tmp_path)) == "null"  # the cpu build
    for driver, (cuda, variant) in DRIVERS.items():
        env = {**_no_gpu_env(tmp_path), "UV_CUDA_DRIVER_VERSION": driver,
               "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": cuda}
        assert _chosen(url, tmp_path, env) == variant, driver


def test_pip_is_never_handed_a_variant_wheel(synthetic_level, tmp_path):
    out = tmp_path / "dl"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "-d", out,
         "--index-url", f"{synthetic_level}/nightly/variants", "vllm-engine==0.1.dev7+gfeed123"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "No matching distribution found for vllm-engine" in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_uv_without_the_preview_flag_installs_nothing(synthetic_level, tmp_path):
    py = make_venv(tmp_path / "venv")
    proc = subprocess.run([UV, "pip", "install", "--python", py, "--dry-run", "vllm-engine",
                           "--index-url", f"{synthetic_level}/nightly/variants"],
                          env=_no_gpu_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "unsupported wheel variants" in proc.stderr


def test_precompiled_editable_install_from_the_variants_level(cpu_variants_level, torch_mirror,
                                                             tmp_path):
    level, wheel = cpu_variants_level
    commit = level.rstrip("/").split("/")[-2]
    repo = tmp_path / "repo"
    run(["git", "clone", "-q", REPO, repo])
    run(["git", "checkout", "-q", "-B", "main", commit], cwd=repo)
    py = make_venv(tmp_path / "venv")
    env = {**_no_gpu_env(tmp_path), "VLLM_USE_PRECOMPILED": "1",
           "VLLM_PRECOMPILED_WHEEL_INDEX": level,
           "VLLM_PRECOMPILED_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([UV, "pip", "install", "--python", py, "-e", repo, "--extra-index-url",
                           f"{torch_mirror}/cpu", "--index-strategy", "unsafe-best-match"],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    used = json.loads(run([py, "-c", "import engine, json; from engine.collect_env import report; "
                           "print(json.dumps(report()['precompiled_from']))"],
                          cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert used["commit"] == commit and used["variant"] == "cpu"
    assert used["source"].startswith(level) and used["source"].endswith("-null.whl")
