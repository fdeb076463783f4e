"""End to end: the real cpu wheel, published into a folder index and into S3
(a moto server on loopback), installed from them by the real uv and pip."""
from __future__ import annotations

import json
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from helpers import UV, PlusAsSpaceServer, make_venv, run
from wheel_index.publish import publish
from wheel_index.server import make_server
from wheel_index.storage import open_storage

pytestmark = pytest.mark.slow

SMOKE = ("import torch, engine; x = torch.randn(2, 32); o = torch.empty_like(x); "
         "engine.ops.rms_norm(o, x, torch.ones(32), 1e-6); print(engine.__version__)")


def _commit_and_version(wheel: Path) -> tuple[str, str]:
    info = json.loads(zipfile.ZipFile(wheel).read("engine/_build_info.json"))
    return info["git_commit"], wheel.name.split("-")[1]


@pytest.fixture(scope="module")
def published_folder(cpu_wheel, tmp_path_factory):
    idx = tmp_path_factory.mktemp("index")
    commit, _ = _commit_and_version(cpu_wheel)
    publish(open_storage(str(idx)), commit, [cpu_wheel], nightly=True, commit_time="1000",
            log=lambda m: None)
    return idx


@pytest.fixture(scope="module")
def folder_index(cpu_wheel, tmp_path_factory):
    idx = tmp_path_factory.mktemp("index")
    commit, _ = _commit_and_version(cpu_wheel)
    publish(open_storage(str(idx)), commit, [cpu_wheel], nightly=True, commit_time="1000",
            log=lambda m: None)
    server = make_server(idx)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_uv_installs_nightly_from_served_folder(cpu_wheel, folder_index, torch_mirror, tmp_path):
    _, version = _commit_and_version(cpu_wheel)
    py = make_venv(tmp_path / "venv")
    run([UV, "pip", "install", "--python", py, "vllm-engine", "--extra-index-url",
         f"{folder_index}/nightly/cpu", "--extra-index-url", f"{torch_mirror}/cpu",
         "--index-strategy", "first-index"])
    assert run([py, "-c", SMOKE], cwd=tmp_path).stdout.strip() == version


def test_pip_installs_by_commit_and_exact_version(cpu_wheel, folder_index, tmp_path):
    commit, version = _commit_and_version(cpu_wheel)
    run([UV, "venv", "-q", "--seed", "--python", sys.executable, tmp_path / "venv"])
    py = tmp_path / "venv" / "bin" / "python"
    # pip takes the cpu torch from this machine's configured find-links folder
    run([py, "-m", "pip", "install", "-q", f"vllm-engine=={version}", "--extra-index-url",
         f"{folder_index}/{commit}/cpu"])
    assert run([py, "-c", SMOKE], cwd=tmp_path).stdout.strip() == version


def test_uv_installs_from_s3_through_its_http_endpoint(cpu_wheel, s3_env, moto_server,
                                                      torch_mirror, tmp_path):
    commit, version = _commit_and_version(cpu_wheel)
    publish(open_storage(f"s3://{s3_env}/wheels"), commit, [cpu_wheel], nightly=True,
            commit_time="1000", log=lambda m: None)
    # What a team does once for a bucket behind a CDN: anonymous read of its objects.
    import boto3

    boto3.client("s3").put_bucket_policy(Bucket=s3_env, Policy=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                       "Resource": f"arn:aws:s3:::{s3_env}/*"}]}))
    base = f"{moto_server.url}/{s3_env}/wheels"
    py = make_venv(tmp_path / "venv")
    run([UV, "pip", "install", "--python", py, "vllm-engine", "--extra-index-url",
         f"{base}/nightly/cpu", "--extra-index-url", f"{torch_mirror}/cpu",
         "--index-strategy", "first-index"])
    assert run([py, "-c", SMOKE], cwd=tmp_path).stdout.strip() == version


def test_uv_and_pip_install_where_plus_reads_as_space(cpu_wheel, published_folder, torch_mirror,
                                                      tmp_path):
    """Served as S3 serves it ('+' in a path is a space): the percent-encoded
    links still resolve, for uv from nightly and for pip from the commit's page."""
    commit, version = _commit_and_version(cpu_wheel)
    server = PlusAsSpaceServer(published_folder)
    try:
        py = make_venv(tmp_path / "uv")
        run([UV, "pip", "install", "--python", py, "vllm-engine", "--extra-index-url",
             f"{server.url}/nightly/cpu", "--extra-index-url", f"{torch_mirror}/cpu",
             "--index-strategy", "first-index"], env={"UV_CACHE_DIR": str(tmp_path / "c")})
        assert run([py, "-c", SMOKE], cwd=tmp_path).stdout.strip() == version
        run([UV, "venv", "-q", "--seed", "--python", sys.executable, tmp_path / "pip"])
        pip_py = tmp_path / "pip" / "bin" / "python"
        run([pip_py, "-m", "pip", "install", "-q", "--no-cache-dir", f"vllm-engine=={version}",
             "--extra-index-url", f"{server.url}/{commit}/cpu"])
        assert run([pip_py, "-c", SMOKE], cwd=tmp_path).stdout.strip() == version
    finally:
        server.close()
