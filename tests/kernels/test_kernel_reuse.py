"""Kernel reuse: the fingerprint, the index's check when a wheel built from one
commit is published under another, and CI's look-up of a reusable wheel.
Real git repositories and real folder indexes; small synthetic wheels."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import make_wheel
from tools import fingerprint, kernel_reuse
from tools.errors import UserError
from wheel_index.publish import publish
from wheel_index.storage import open_storage


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """main: X (kernels), Y (Python only), Z (a kernel change)."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    x = commit(r, {"csrc/ops.cpp": "int f() { return 1; }\n", "CMakeLists.txt": "project(x)\n",
                   "cmake/cpu.cmake": "# cpu\n", "requirements/build/cpu.txt": "cmake\n",
                   "requirements/torch/cpu.txt": "torch==2.13.0+cpu\n",
                   "engine/__init__.py": "A = 1\n"}, "X: kernels")
    y = commit(r, {"engine/__init__.py": "A = 2\n"}, "Y: python only")
    z = commit(r, {"csrc/ops.cpp": "int f() { return 2; }\n"}, "Z: kernel change")
    return r, x, y, z


def built_from(r: Path, sha: str, tmp: Path, env=None, **kw) -> Path:
    """A wheel whose build info says its kernels were compiled at sha."""
    sources = fingerprint.sources_of_commit(r, sha)
    fp = fingerprint.fingerprint(sources, "cpu", platform.machine(),
                                 fingerprint.flags("cpu", env or {}))
    return make_wheel(tmp / sha[:8], "0.1.dev3+g1234567.cpu", commit=sha,
                      info={"kernel_fingerprint": fp, "kernel_sources": sources}, **kw)


def test_fingerprint_follows_compiled_inputs_only(repo):
    r, x, y, z = repo
    tree = fingerprint.sources_of_tree(r)
    assert tree == fingerprint.sources_of_commit(r, z)  # disk and git agree
    assert fingerprint.sources_of_commit(r, x) == fingerprint.sources_of_commit(r, y)
    assert fingerprint.sources_of_commit(r, y) != fingerprint.sources_of_commit(r, z)
    (r / "requirements/torch/cpu.txt").write_text("torch==2.14.0+cpu\n")  # the torch pin counts
    assert fingerprint.sources_of_tree(r) != tree
    (r / "csrc/new.h").write_text("// untracked files count too\n")
    git(r, "checkout", "-q", "--", ".")
    assert fingerprint.sources_of_tree(r) != tree


def test_fingerprint_covers_variant_arch_and_flags(repo):
    r, *_ = repo
    base = fingerprint.of_build(r, "cpu", "cpu", {}, arch="x86_64")
    again = fingerprint.of_build(r, "cpu", "cpu", {"TORCH_CUDA_ARCH_LIST": "9.0"}, arch="x86_64")
    assert base == again  # a CUDA knob does not change a cpu build
    for other in (fingerprint.of_build(r, "cpu", "cpu", {"VLLM_CPU_DISABLE_AVX512": "1"},
                                       arch="x86_64"),
                  fingerprint.of_build(r, "cpu", "cpu", {"CMAKE_ARGS": "-DX=1"}, arch="x86_64"),
                  fingerprint.of_build(r, "cpu", "cpu", {}, arch="aarch64"),
                  fingerprint.of_build(r, "cu130", "cuda", {}, arch="x86_64")):
        assert other["kernel_fingerprint"] != base["kernel_fingerprint"]
        assert other["kernel_sources"] == base["kernel_sources"]
    cuda = fingerprint.of_build(r, "cu130", "cuda", {}, arch="x86_64")
    assert fingerprint.of_build(r, "cu130", "cuda", {"TORCH_CUDA_ARCH_LIST": "9.0"},
                                arch="x86_64") != cuda


def test_publish_accepts_reused_kernels_when_fingerprints_agree(repo, tmp_path, monkeypatch):
    r, x, y, z = repo
    monkeypatch.chdir(r)
    store = open_storage(str(tmp_path / "index"))
    said = []
    publish(store, y, [built_from(r, x, tmp_path)], commit_time="100", log=said.append)
    assert store.read(f"{y}/cpu/metadata.json") is not None
    assert any("identical" in m and x[:12] in m for m in said)


def test_publish_refuses_reused_kernels_when_inputs_differ(repo, tmp_path, monkeypatch):
    r, x, y, z = repo
    monkeypatch.chdir(r)
    store = open_storage(str(tmp_path / "index"))
    with pytest.raises(UserError, match=f"built from commit {x}, whose compiled inputs differ "
                                        f"from {z}'s"):
        publish(store, z, [built_from(r, x, tmp_path)], commit_time="100")
    plain = make_wheel(tmp_path / "plain", "0.1.dev3+g1234567.cpu", commit=x)
    with pytest.raises(UserError, match="records no kernel fingerprint"):
        publish(store, y, [plain], commit_time="100")
    assert store.list("") == []


def _index_with(r: Path, sha: str, tmp: Path, **kw) -> Path:
    folder = tmp / "index"
    here = Path.cwd()
    try:
        os.chdir(r)
        publish(open_storage(str(folder)), sha, [built_from(r, sha, tmp, **kw)], nightly=True,
                commit_time="100", log=lambda m: None)
    finally:
        os.chdir(here)
    return folder


def test_find_returns_the_wheel_with_this_fingerprint(repo, tmp_path):
    r, x, y, z = repo
    index = _index_with(r, x, tmp_path)
    git(r, "checkout", "-q", y)
    env = {"VLLM_PRECOMPILED_CACHE": str(tmp_path / "cache")}
    found = kernel_reuse.find(r, str(index), "cpu", env, log=lambda m: None)
    assert found and f"{x}/cpu/vllm-engine/" in found and "#sha256=" in found
    # another flag: other compiled files, so nothing to reuse
    assert kernel_reuse.find(r, str(index), "cpu", {**env, "VLLM_CPU_DISABLE_AVX512": "1"},
                             log=lambda m: None) is None
    # a kernel change since: nothing to reuse (nightly is x, whose inputs differ)
    git(r, "checkout", "-q", z)
    said = []
    assert kernel_reuse.find(r, str(index), "cpu", env, log=said.append) is None
    assert any("nightly/cpu" in m for m in said)


def test_find_cli_is_quiet_without_an_index(repo):
    res = subprocess.run([sys.executable, "-m", "tools.kernel_reuse", "find", "--variant", "cpu",
                          "--index", ""], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0 and res.stdout == ""


def test_build_info_template_records_the_fingerprint():
    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    assert "${VLLM_KERNEL_FINGERPRINT}" in cmake and "${VLLM_KERNEL_SOURCES}" in cmake
