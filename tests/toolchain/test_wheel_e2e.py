"""End to end: build the cpu wheel for real, repair it, install it into fresh
virtual environments with the real uv and pip, and run its kernels there."""
from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import REPO, TORCH_CPU_PIN, TORCH_CPU_VERSION, UV, copy_source_tree, make_venv, run

from engine.platforms.cpu_features import X86_ISAS

pytestmark = pytest.mark.slow

WHEEL_RE = re.compile(
    r"vllm_engine-0\.1\.dev\d+\+g[0-9a-f]{7,}(\.d\d{8})?\.cpu-cp38-abi3-manylinux_2_(\d+)_x86_64\.whl")

# What the extension may need at run time: torch's own libraries (already
# loaded by `import torch`) and the base system.
# ld-linux: the dynamic loader itself, there on every glibc system, for
# __tls_get_addr (the kernels' per-thread scratch buffers are thread_local); torch's
# own libtorch_cpu.so needs it too
ALLOWED_NEEDED = {"libtorch_cpu.so", "libtorch.so", "libc10.so", "libgomp.so.1",
                  "libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6",
                  "ld-linux-x86-64.so.2"}


def _mirror_args(url: str) -> list[str]:
    return ["--extra-index-url", f"{url}/cpu", "--index-strategy", "unsafe-best-match"]


def test_repaired_wheel_is_honest(cpu_wheel: Path, tmp_path: Path):
    m = WHEEL_RE.fullmatch(cpu_wheel.name)
    assert m, f"unexpected wheel name {cpu_wheel.name}"
    tag_glibc = int(m.group(2))
    names = zipfile.ZipFile(cpu_wheel).namelist()
    assert "engine/_C.abi3.so" in names and "engine/_build_info.json" in names
    assert not [n for n in names if re.search(r"lib(torch|c10|gomp|iomp)", n)], names
    info = json.loads(zipfile.ZipFile(cpu_wheel).read("engine/_build_info.json"))
    assert info["variant"] == "cpu" and info["torch_version"] == TORCH_CPU_VERSION
    assert set(info["code_paths"]) == {"cpu-avx2", "cpu-avx512", "cpu-avx512_bf16"}
    assert re.fullmatch(r"[0-9a-f]{40}", info["git_commit"])

    show = run([sys.executable, "-m", "auditwheel", "show", cpu_wheel]).stdout
    glibc = [tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+\.\d+)", show)]
    assert glibc and max(glibc) <= (2, tag_glibc), (max(glibc), tag_glibc)

    zipfile.ZipFile(cpu_wheel).extract("engine/_C.abi3.so", tmp_path)
    dyn = run(["readelf", "-d", tmp_path / "engine" / "_C.abi3.so"]).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dyn))
    assert needed <= ALLOWED_NEEDED, needed - ALLOWED_NEEDED
    assert "libtorch_python.so" not in needed
    assert not re.search(r"RUNPATH|RPATH", dyn)  # nothing points at the build machine


def test_wheel_in_fresh_venv_runs_every_op(cpu_wheel: Path, torch_mirror: str, tmp_path: Path):
    py = make_venv(tmp_path / "venv", str(cpu_wheel), "pytest",
                   extra_args=_mirror_args(torch_mirror))
    where = run([py, "-c", "import engine, torch; print(engine.__file__); print(torch.__version__)"],
                cwd=tmp_path).stdout.split()
    assert where[0].startswith(str(tmp_path / "venv")) and where[1] == TORCH_CPU_VERSION
    # The op suite, both ISA paths, against the installed wheel (not the source tree).
    res = run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", REPO / "tests" / "kernels" / "test_ops.py"],
              cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert re.search(r"\d+ passed", res.stdout)

    # One OpenMP runtime: the extension uses the libgomp torch loaded.
    maps = run([py, "-c", """
import torch, engine
x = torch.randn(256, 4096); out = torch.empty_like(x)
engine.ops.rms_norm(out, x, torch.ones(4096), 1e-6)
print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'gomp' in l or 'iomp' in l})))
"""], cwd=tmp_path).stdout.split()
    assert len(maps) == 1 and "torch/lib" in maps[0], maps

    # A different torch than the one compiled against: a clear error, no crash.
    site = Path(where[0]).parent
    record = site / "_build_info.json"
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "torch_version": "2.12.0+cpu"}))
    res = run([py, "-c", "import engine.ops"], cwd=tmp_path, check=False)
    assert res.returncode != 0
    assert "TorchMismatchError" in res.stderr and "2.12.0+cpu" in res.stderr
    assert TORCH_CPU_VERSION in res.stderr and f"pip install '{TORCH_CPU_PIN}'" in res.stderr
    record.write_text(json.dumps(data))

    # A bad VLLM_CPU_ISA is refused by name.
    res = run([py, "-c", "import engine.ops"], env={"VLLM_CPU_ISA": "sse"}, cwd=tmp_path, check=False)
    assert res.returncode != 0 and "VLLM_CPU_ISA='sse' is not valid" in res.stderr


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    return copy_source_tree(tmp_path_factory.mktemp("src") / "vllm-engine")


def test_uv_build_and_python_m_build(source_copy: Path, torch_mirror: str, tmp_path: Path):
    py = make_venv(tmp_path / "venv", "build")
    env = {"VLLM_TARGET_DEVICE": "cpu"}
    run([UV, "build", "-q", "--wheel", "--out-dir", tmp_path / "uv", *_mirror_args(torch_mirror)],
        env=env, cwd=source_copy)
    # python -m build installs the build requirements with pip, which finds
    # the cpu torch through this machine's pip configuration.
    run([py, "-m", "build", "--wheel", "--outdir", tmp_path / "pip"], env=env, cwd=source_copy)
    for folder in ("uv", "pip"):
        (wheel,) = (tmp_path / folder).glob("*.whl")
        assert re.search(r"\.cpu-cp38-abi3-linux_x86_64\.whl$", wheel.name), wheel.name


def test_uv_editable_and_regular_install(source_copy: Path, torch_mirror: str, tmp_path: Path):
    smoke = ("import torch, engine; x = torch.randn(3, 64); o = torch.empty_like(x); "
             "engine.ops.rms_norm(o, x, torch.ones(64), 1e-6); "
             "print(engine.BUILD_INFO.variant, engine.ops.cpu_isa(), engine.__file__)")
    for mode in (["-e"], []):
        venv = tmp_path / ("editable" if mode else "regular")
        py = make_venv(venv)
        res = run([UV, "pip", "install", "-v", "--python", py, *mode, source_copy,
                   *_mirror_args(torch_mirror)], env={"VLLM_TARGET_DEVICE": "cpu"})
        # every torch resolved (the isolated build environment's included) is the
        # cpu build, and no CUDA library was selected
        picked = re.findall(r"Selecting: (\S+)", res.stderr)
        torches = [p for p in picked if p.startswith("torch==")]
        assert torches and set(torches) == {TORCH_CPU_PIN}, torches
        assert not [p for p in picked if p.startswith("nvidia-")], picked
        out = run([py, "-c", smoke], cwd=tmp_path).stdout.split()
        assert out[0] == "cpu" and out[1] in X86_ISAS
        expected_root = source_copy if mode else venv
        assert out[2].startswith(str(expected_root)), out


def test_empty_editable_install_compiles_nothing(source_copy: Path, torch_mirror: str,
                                                  tmp_path: Path):
    py = make_venv(tmp_path / "venv", TORCH_CPU_PIN, extra_args=_mirror_args(torch_mirror))
    res = run([UV, "pip", "install", "--python", py, "-e", source_copy, "-v"],
              env={"VLLM_TARGET_DEVICE": "empty"})
    log = res.stdout + res.stderr
    build_deps = re.findall(r"adding direct dependency: ([A-Za-z0-9_.-]+)", log, re.IGNORECASE)
    assert build_deps and not {"torch", "cmake", "ninja"} & {d.lower() for d in build_deps}, build_deps
    assert "Build files have been written" not in log and "Building CXX object" not in log
    out = run([py, "-c", "import engine; print(engine.BUILD_INFO.variant, engine.__version__)"],
              cwd=tmp_path).stdout.split()
    assert out[0] == "empty" and out[1].endswith(".empty")


def test_use_existing_torch_keeps_the_installed_torch(tmp_path, torch_mirror):
    src = copy_source_tree(tmp_path / "src")
    out = run([sys.executable, "use_existing_torch.py"], cwd=src).stdout
    assert f"requirements/torch/cpu.txt: removed: {TORCH_CPU_PIN}" in out
    py = make_venv(tmp_path / "venv", TORCH_CPU_PIN, "scikit-build-core>=0.11",
                   "setuptools-scm>=8", "cmake>=3.26", "ninja", "packaging",
                   extra_args=_mirror_args(torch_mirror))
    probe = ("import os, torch; s = os.stat(torch.__file__); "
             "print(torch.__version__, torch.__file__, s.st_ino, s.st_mtime_ns)")
    before = run([py, "-c", probe], cwd=tmp_path).stdout
    res = run([UV, "pip", "install", "-v", "--python", py, "--no-build-isolation", "-e", src],
              env={"VLLM_TARGET_DEVICE": "cpu"})
    assert not re.search(r"^\s*[-+] torch==", res.stderr, re.M), "torch was reinstalled"
    assert run([py, "-c", probe], cwd=tmp_path).stdout == before  # same version, same file
    meta = run([py, "-c", "import importlib.metadata as m; print(m.requires('vllm-engine'))"],
               cwd=tmp_path).stdout
    assert "torch==" not in meta  # the wheel pins nothing: it uses the torch that is there
    run([py, "-c", "import torch, engine; x = torch.randn(2, 8); o = torch.empty_like(x); "
                   "engine.ops.rms_norm(o, x, torch.ones(8), 1e-6)"], cwd=tmp_path)


def test_disable_avx512_leaves_that_path_out(source_copy, torch_mirror, tmp_path):
    py = make_venv(tmp_path / "venv", TORCH_CPU_PIN, "scikit-build-core>=0.11",
                   "setuptools-scm>=8", "cmake>=3.26", "ninja", "packaging", "numpy",
                   "safetensors", "tokenizers", extra_args=_mirror_args(torch_mirror))
    run([UV, "pip", "install", "-q", "--python", py, "--no-build-isolation", source_copy],
        env={"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_DISABLE_AVX512": "1"})
    out = run([py, "-c", "import torch, engine; print(engine.BUILD_INFO.code_paths, "
                         "engine.ops.cpu_isa(), torch.ops._C.cpu_compiled_isas())"],
              cwd=tmp_path).stdout
    assert out.split() == ["('cpu-avx2',)", "avx2", "avx2"], out
    res = run([py, "-c", "import engine.ops"], env={"VLLM_CPU_ISA": "avx512"}, cwd=tmp_path,
              check=False)
    assert res.returncode != 0 and "VLLM_CPU_ISA=avx512 is not compiled into this build" in res.stderr
