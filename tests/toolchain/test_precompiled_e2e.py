"""Precompiled mode end to end: a git repository whose main has the real cpu
wheel published (a folder index, and the same folder served on 127.0.0.1),
installed with build isolation by uv and pip in every situation the mode
must handle, succeeding or refusing cleanly."""
from __future__ import annotations

import json
import shutil
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from helpers import REPO, UV, PlusAsSpaceServer, free_port, make_venv, run

from tools.hashing import sha256_file
from wheel_index.publish import publish
from wheel_index.server import make_server
from wheel_index.storage import open_storage

pytestmark = pytest.mark.slow

SMOKE = ("import torch, engine, json; x = torch.randn(2, 32); o = torch.empty_like(x); "
         "engine.ops.rms_norm(o, x, torch.ones(32), 1e-6); "
         "from engine.collect_env import report; print(json.dumps(report()['precompiled_from']))")


def git(repo, *args):
    return run(["git", *args], cwd=repo).stdout.strip()


@pytest.fixture(scope="module")
def published(cpu_wheel, tmp_path_factory):
    """(index folder, served URL, the commit that has a wheel)."""
    commit = json.loads(zipfile.ZipFile(cpu_wheel).read("engine/_build_info.json"))["git_commit"]
    idx = tmp_path_factory.mktemp("index")
    publish(open_storage(str(idx)), commit, [cpu_wheel], nightly=True, commit_time="1000",
            log=lambda m: None)
    server = make_server(idx)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield idx, f"http://127.0.0.1:{server.server_address[1]}", commit
    server.shutdown()
    server.server_close()


@pytest.fixture
def repo(published, tmp_path):
    """A clone whose origin/main is the commit with a published wheel."""
    _, _, commit = published
    dest = tmp_path / "repo"
    run(["git", "clone", "-q", REPO, dest])
    git(dest, "checkout", "-q", "-B", "main", commit)
    git(dest, "update-ref", "refs/remotes/origin/main", commit)
    git(dest, "config", "user.email", "t@example.com")
    git(dest, "config", "user.name", "t")
    return dest


def commit_change(repo: Path, path: str, text: str, message: str) -> str:
    with open(repo / path, "a") as f:
        f.write(text)
    git(repo, "commit", "-qam", message)
    return git(repo, "rev-parse", "HEAD")


def install(repo, tmp_path, torch_mirror, env, *, tool="uv", editable=True, check=True,
            verbose=False):
    venv = tmp_path / f"venv-{tool}-{editable}"
    if tool == "uv":
        py = make_venv(venv)
        cmd = [UV, "pip", "install", "--python", py, *(["-e"] if editable else []), repo,
               "--extra-index-url", f"{torch_mirror}/cpu", "--index-strategy", "unsafe-best-match",
               *(["-v"] if verbose else [])]  # uv shows a successful build's output only then
    else:
        run([UV, "venv", "-q", "--seed", "--python", sys.executable, venv])
        py = venv / "bin" / "python"
        cmd = [py, "-m", "pip", "install", "-q", *(["-e"] if editable else []), repo]
    full = {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_CACHE": str(tmp_path / "cache"), **env}
    res = run(cmd, env=full, check=False)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return py, res


def smoke(py, tmp_path) -> dict:
    return json.loads(run([py, "-c", SMOKE], cwd=tmp_path).stdout.strip().splitlines()[-1])


def no_kernels_in(repo: Path) -> bool:
    return not list((repo / "engine").glob("*.so")) and not (repo / "engine" / "_build_info.json").exists()


def test_feature_branch_uv_editable(repo, published, torch_mirror, tmp_path):
    idx, _, commit = published
    git(repo, "checkout", "-q", "-b", "feature")
    commit_change(repo, "engine/envs.py", "\n# a Python-only change\n", "python only")
    py, _ = install(repo, tmp_path, torch_mirror, {"VLLM_PRECOMPILED_WHEEL_INDEX": str(idx)})
    used = smoke(py, tmp_path)
    assert used["commit"] == commit and used["variant"] == "cpu" and used["fallback_from"] is None
    # a folder index's wheel is used in place: the stored file itself, checked, never copied
    stored = Path(used["source"])
    assert stored.parent == idx / commit / "cpu" / "vllm-engine" and stored.is_file()
    assert sha256_file(stored) == used["sha256"]
    assert not (tmp_path / "cache").exists()


def test_detached_head_pip_editable_from_served_index(repo, published, torch_mirror, tmp_path):
    _, url, commit = published
    commit_change(repo, "README.md", "\nmore docs\n", "docs")
    git(repo, "checkout", "-q", "--detach", "HEAD")
    py, _ = install(repo, tmp_path, torch_mirror, {"VLLM_PRECOMPILED_WHEEL_INDEX": url},
                    tool="pip")
    used = smoke(py, tmp_path)
    assert used["commit"] == commit and used["source"].startswith(url)
    assert (tmp_path / "cache" / used["sha256"]).is_dir()


class CountingServer:
    """The index served on 127.0.0.1, remembering every path asked for."""

    def __init__(self, root: Path):
        self.paths: list[str] = []
        paths = self.paths

        self.httpd = make_server(root)

        class Handler(self.httpd.RequestHandlerClass):  # the served root comes with it
            def do_GET(self):
                paths.append(self.path)
                super().do_GET()

        self.httpd.RequestHandlerClass = Handler
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_reinstall_downloads_the_wheel_only_once(repo, published, torch_mirror, tmp_path):
    idx, _, commit = published
    server = CountingServer(idx)
    try:
        env = {"VLLM_PRECOMPILED_WHEEL_INDEX": server.url}
        py, _ = install(repo, tmp_path, torch_mirror, env)
        used = smoke(py, tmp_path)
        assert used["commit"] == commit and used["source"].startswith(server.url)
        wheels = [p for p in server.paths if p.endswith(".whl")]
        assert len(wheels) == 1, server.paths  # downloaded once, into the cache keyed by sha256
        assert (tmp_path / "cache" / used["sha256"]).is_dir()

        # the same install again, from a fresh environment: only the small metadata
        # document is read, the wheel comes from the cache
        git(repo, "clean", "-qfdX", "engine")
        del server.paths[:]
        py, _ = install(repo, tmp_path / "again", torch_mirror,
                        {**env, "VLLM_PRECOMPILED_CACHE": str(tmp_path / "cache")})
        assert smoke(py, tmp_path)["sha256"] == used["sha256"]
        assert server.paths and not [p for p in server.paths if p.endswith(".whl")], server.paths
    finally:
        server.close()

    # and with the server gone, a pinned location (URL#sha256) installs from the cache alone
    git(repo, "clean", "-qfdX", "engine")
    py, _ = install(repo, tmp_path / "offline", torch_mirror, {
        "VLLM_PRECOMPILED_WHEEL_LOCATION": f"{used['source']}#sha256={used['sha256']}",
        "VLLM_PRECOMPILED_CACHE": str(tmp_path / "cache")})
    assert smoke(py, tmp_path)["sha256"] == used["sha256"]


def test_nightly_and_non_editable(repo, published, torch_mirror, tmp_path):
    _, url, commit = published
    py, _ = install(repo, tmp_path, torch_mirror, {"VLLM_PRECOMPILED_WHEEL_INDEX": url,
                                                   "VLLM_PRECOMPILED_WHEEL_COMMIT": "nightly"},
                    editable=False)
    assert smoke(py, tmp_path)["commit"] == commit


def test_location_as_path_and_as_url(repo, published, cpu_wheel, torch_mirror, tmp_path):
    _, url, commit = published
    py, _ = install(repo, tmp_path, torch_mirror,
                    {"VLLM_PRECOMPILED_WHEEL_LOCATION": str(cpu_wheel)})
    assert smoke(py, tmp_path)["source"] == str(cpu_wheel)
    git(repo, "clean", "-qfdX", "engine")
    wheel_url = f"{url}/{commit}/cpu/vllm-engine/{cpu_wheel.name.replace('+', '%2B')}"
    py, _ = install(repo, tmp_path / "u", torch_mirror, {"VLLM_PRECOMPILED_WHEEL_LOCATION": wheel_url})
    assert smoke(py, tmp_path)["source"] == wheel_url


def test_missing_base_wheel_falls_back_safely(repo, published, torch_mirror, tmp_path):
    idx, _, commit = published
    commit_change(repo, "engine/envs.py", "\n# main moved on, CI not done yet\n", "python only")
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": str(idx), "VLLM_PRECOMPILED_BASE_REF": "main"}
    py, res = install(repo, tmp_path, torch_mirror, env)
    used = smoke(py, tmp_path)
    assert used["commit"] == commit and used["fallback_from"] == git(repo, "rev-parse", "HEAD")


def test_missing_base_wheel_with_changed_kernels_is_refused(repo, published, torch_mirror, tmp_path):
    idx, _, _ = published
    commit_change(repo, "csrc/ops.h", "\n// a kernel change\n", "kernels")
    commit_change(repo, "engine/envs.py", "\n# and a Python one\n", "python")
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": str(idx), "VLLM_PRECOMPILED_BASE_REF": "main"}
    _, res = install(repo, tmp_path, torch_mirror, env, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "has different compiled inputs" in out
    assert "VLLM_PRECOMPILED_WHEEL_COMMIT=nightly" in out and no_kernels_in(repo)


def test_edited_csrc_is_refused_unless_allowed(repo, published, torch_mirror, tmp_path):
    idx, _, _ = published
    with open(repo / "csrc" / "cpu" / "kernels_impl.cpp", "a") as f:
        f.write("\n// uncommitted\n")
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": str(idx)}
    _, res = install(repo, tmp_path, torch_mirror, env, check=False)
    assert res.returncode != 0 and "csrc/cpu/kernels_impl.cpp" in res.stderr
    assert no_kernels_in(repo)
    py, res = install(repo, tmp_path / "ok", torch_mirror,
                      {**env, "VLLM_PRECOMPILED_ALLOW_CSRC_CHANGES": "1"}, verbose=True)
    assert "WARNING" in res.stderr and smoke(py, tmp_path)


def test_variant_missing_from_index_is_refused(repo, published, torch_mirror, tmp_path):
    idx, _, _ = published
    _, res = install(repo, tmp_path, torch_mirror, {"VLLM_PRECOMPILED_WHEEL_INDEX": str(idx),
                                                     "VLLM_PRECOMPILED_WHEEL_VARIANT": "cu130"},
                     check=False)
    assert res.returncode != 0 and "no precompiled cu130 wheel" in res.stderr
    assert no_kernels_in(repo)


def test_corrupted_wheel_is_refused_and_nothing_written(repo, published, torch_mirror, tmp_path):
    idx, _, commit = published
    bad = tmp_path / "bad-index"
    shutil.copytree(idx, bad, symlinks=False)
    (stored,) = (bad / commit / "cpu" / "vllm-engine").glob("*.whl")
    stored.write_bytes(stored.read_bytes()[:-100] + b"\0" * 100)
    server = make_server(bad)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _, res = install(repo, tmp_path, torch_mirror, {
            "VLLM_PRECOMPILED_WHEEL_INDEX": f"http://127.0.0.1:{server.server_address[1]}"},
            check=False)
    finally:
        server.shutdown()
        server.server_close()
    assert res.returncode != 0 and "sha256 mismatch" in res.stderr
    assert no_kernels_in(repo)


def test_server_down_names_the_url(repo, torch_mirror, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    _, res = install(repo, tmp_path, torch_mirror, {"VLLM_PRECOMPILED_WHEEL_INDEX": url},
                     check=False)
    assert res.returncode != 0 and f"cannot reach the wheel index at {url}" in res.stderr
    assert "Traceback" not in res.stderr and no_kernels_in(repo)


def test_served_where_plus_reads_as_space(repo, published, torch_mirror, tmp_path):
    """An index behind S3 or a CDN, which read '+' in a path as a space: the
    percent-encoded path in metadata.json still finds the wheel."""
    idx, _, commit = published
    server = PlusAsSpaceServer(idx)
    try:
        py, _ = install(repo, tmp_path, torch_mirror,
                        {"VLLM_PRECOMPILED_WHEEL_INDEX": server.url})
    finally:
        server.close()
    used = smoke(py, tmp_path)
    assert used["commit"] == commit and "%2B" in used["source"]
