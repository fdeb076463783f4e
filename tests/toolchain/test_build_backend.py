"""The build front-end's logic without building: versions, requirement files,
the PEP 517 hooks' requirements and config settings, use_existing_torch.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import use_existing_torch
from tools import build_backend
from tools.build_plan import resolve
from tools.errors import UserError
from tools.requirements import read_requirements, runtime_requirements
from tools.version import with_variant

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scm,variant,default,expected", [
    ("0.1.dev42+g1a2b3c4", "cpu", False, "0.1.dev42+g1a2b3c4.cpu"),
    ("0.1.dev42+g1a2b3c4", "cu130", True, "0.1.dev42+g1a2b3c4.cu130"),  # dev builds always say
    ("0.1.dev42+g1a2b3c4.d20261130", "cu129", False, "0.1.dev42+g1a2b3c4.d20261130.cu129"),
    ("1.2.0", "cpu", False, "1.2.0+cpu"),
    ("1.2.0", "cu130", True, "1.2.0"),  # only a release of the main CUDA variant drops it
    ("1.2.0", "cu129", False, "1.2.0+cu129"),
    ("0.1.dev3+g1a2b3c4.cpu", "cpu", False, "0.1.dev3+g1a2b3c4.cpu"),  # from an sdist's PKG-INFO
])
def test_version_local_segment(scm, variant, default, expected):
    assert with_variant(scm, variant, default) == expected
    assert expected.count("+") <= 1


def test_runtime_requirements_pin_torch_once_with_suffix():
    reqs = runtime_requirements("cpu")
    torch = [r for r in reqs if r.startswith("torch")]
    assert torch[0].startswith("torch==2.13.0+cpu;")
    assert not any("+cpu+cpu" in r for r in reqs)
    assert runtime_requirements("cu130")[-1] == "torch==2.13.0"


def test_requirement_file_errors(tmp_path):
    (tmp_path / "a.txt").write_text("-r b.txt\n")
    (tmp_path / "b.txt").write_text("-r a.txt\n")
    with pytest.raises(UserError, match="loop"):
        read_requirements(tmp_path / "a.txt")
    (tmp_path / "c.txt").write_text("torch===\n")
    with pytest.raises(UserError, match=r"c.txt:1: invalid requirement"):
        read_requirements(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_text("--extra-index-url http://x\n")
    with pytest.raises(UserError, match="not supported here"):
        read_requirements(tmp_path / "d.txt")


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("VLLM_TARGET_DEVICE", "VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION",
                 "VLLM_MAIN_CUDA_VERSION", "VLLM_PRECOMPILED_WHEEL_VARIANT", "MAX_JOBS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def names(reqs):
    return {r.split(";")[0].split("=")[0].split(">")[0].strip() for r in reqs}


def test_cpu_build_requires_cpu_torch_cmake_ninja(in_repo):
    in_repo.setenv("VLLM_TARGET_DEVICE", "cpu")
    reqs = build_backend.get_requires_for_build_wheel()
    assert any(r.startswith("torch==2.13.0+cpu;") for r in reqs)
    assert not any(r.startswith("torch==2.13.0;") and "x86_64" in r and "!=" not in r for r in reqs)
    assert {"cmake", "ninja", "scikit-build-core"} <= names(reqs)
    assert build_backend.get_requires_for_build_editable() == reqs


@pytest.mark.parametrize("env", [{"VLLM_TARGET_DEVICE": "empty"}, {"VLLM_USE_PRECOMPILED": "1"},
                                 {"VLLM_PRECOMPILED_WHEEL_LOCATION": "/x.whl"}])
def test_nothing_heavy_without_compiling(in_repo, env):
    for k, v in env.items():
        in_repo.setenv(k, v)
    in_repo.setenv("VLLM_PRECOMPILED_WHEEL_VARIANT", "cpu") if "VLLM_TARGET_DEVICE" not in env else None
    reqs = build_backend.get_requires_for_build_wheel()
    assert not names(reqs) & {"torch", "cmake", "ninja"}, reqs


def test_build_dirs_are_per_variant(in_repo):
    in_repo.setenv("VLLM_TARGET_DEVICE", "cpu")
    cpu = build_backend.config_settings_for(resolve(), {})
    in_repo.setenv("VLLM_TARGET_DEVICE", "cuda")
    in_repo.setenv("VLLM_MAIN_CUDA_VERSION", "13.0")
    cuda = build_backend.config_settings_for(resolve(), {})
    assert cpu["build-dir"] == "build/cpu" and cuda["build-dir"] == "build/cu130"
    assert cuda["cmake.define.VLLM_TARGET_DEVICE"] == "cuda"
    assert cuda["cmake.define.VLLM_TORCH_REQUIREMENT"] == "torch==2.13.0"
    assert cpu["cmake.define.VLLM_TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_max_jobs(in_repo):
    in_repo.setenv("VLLM_TARGET_DEVICE", "cpu")
    in_repo.setenv("MAX_JOBS", "3")
    build_backend.config_settings_for(resolve(), {})
    import os
    assert os.environ["CMAKE_BUILD_PARALLEL_LEVEL"] == "3"
    in_repo.setenv("MAX_JOBS", "many")
    with pytest.raises(UserError, match="MAX_JOBS='many' must be a positive integer"):
        resolve()


def test_bad_device_is_a_clear_build_error(in_repo, capsys):
    in_repo.setenv("VLLM_TARGET_DEVICE", "tpu")
    with pytest.raises(SystemExit):
        build_backend.get_requires_for_build_wheel()
    err = capsys.readouterr().err
    assert "VLLM_TARGET_DEVICE='tpu' is not a known target device; valid values" in err


def test_use_existing_torch(tmp_path, capsys):
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = [\n  "scikit-build-core",\n  "torch==2.13.0",\n]\n'
        '# torch is mentioned in this comment\n')
    (tmp_path / "requirements" / "extra.in").write_text("torchvision>=0.20  # pinned\nnumpy\n")
    use_existing_torch.main(["--prefix"], root=tmp_path)
    out = capsys.readouterr().out
    assert "requirements/torch/cpu.txt: removed: torch==2.13.0+cpu;" in out
    assert "requirements/extra.in: removed: torchvision>=0.20" in out
    assert '"torch==2.13.0"' not in out  # --prefix: only lines starting with a pin
    use_existing_torch.main([], root=tmp_path)
    out = capsys.readouterr().out
    assert 'pyproject.toml: removed:   "torch==2.13.0",' in out
    assert "comment" in (tmp_path / "pyproject.toml").read_text()
    use_existing_torch.main([], root=tmp_path)  # idempotent
    assert "nothing to do" in capsys.readouterr().out
    for f in (tmp_path / "requirements").rglob("*.txt"):
        assert not any(line.startswith("torch") for line in f.read_text().splitlines()), f


def test_build_info_gets_the_kernel_fingerprint(in_repo):
    in_repo.setenv("VLLM_TARGET_DEVICE", "cpu")
    cs = build_backend.config_settings_for(resolve(), {})
    fp = cs["cmake.define.VLLM_KERNEL_FINGERPRINT"]
    assert len(fp) == 64 and len(cs["cmake.define.VLLM_KERNEL_SOURCES"]) == 64
    in_repo.setenv("VLLM_CPU_DISABLE_AVX512", "1")
    other = build_backend.config_settings_for(resolve(), {})
    assert other["cmake.define.VLLM_KERNEL_FINGERPRINT"] != fp
    assert other["cmake.define.VLLM_KERNEL_SOURCES"] == cs["cmake.define.VLLM_KERNEL_SOURCES"]


def _sdist_tree(tmp_path, version: str) -> Path:
    (tmp_path / "PKG-INFO").write_text(f"Metadata-Version: 2.4\nName: vllm-engine\n"
                                       f"Version: {version}\n")
    return tmp_path


@pytest.mark.parametrize("version,variant", [
    ("0.1.dev3+g1a2b3c4.cpu", "cpu"), ("0.1.dev3+g1a2b3c4.d20261130.cu129", "cu129"),
    ("1.2.0+empty", "empty"), ("1.2.0", "cu130"),  # a plain release is the main CUDA variant
])
def test_an_sdist_builds_its_own_variant(in_repo, tmp_path, version, variant):
    from tools.build_plan import sdist_variant, target_variant

    root = _sdist_tree(tmp_path, version)
    assert sdist_variant(root, {}).label == variant
    assert target_variant({}, root).label == variant
    assert target_variant({"VLLM_TARGET_DEVICE": "cpu"}, REPO).label == "cpu"  # a git checkout


def test_an_sdist_refuses_another_target(in_repo, tmp_path):
    from tools.build_plan import target_variant

    root = _sdist_tree(tmp_path, "0.1.dev3+g1a2b3c4.cpu")
    with pytest.raises(UserError, match=r"this sdist was made for the cpu variant and builds "
                                        r"cpu wheels only \(not empty\)"):
        target_variant({"VLLM_TARGET_DEVICE": "empty"}, root)
    assert target_variant({"VLLM_TARGET_DEVICE": "cpu"}, root).label == "cpu"
