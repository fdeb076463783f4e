"""The aarch64 cpu wheel: cross-built on this x86_64 machine by
`ci/build-wheel.sh cpu <out> --arch aarch64`, installed with pip into a fresh
virtual environment of an arm64 Debian root file system (ci/setup-aarch64.sh)
and run there under qemu: the op tests against the references on both AArch64
code paths, the engine's greedy output against transformers, and `engine env`.
The index, uv and precompiled mode pick it for aarch64 machines.

On an aarch64 machine the same tests run natively (no chroot)."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from helpers import REPO, UV, Server, run

pytestmark = [pytest.mark.aarch64, pytest.mark.slow]

NATIVE = platform.machine() == "aarch64"
SETUP = "run 'bash ci/setup-aarch64.sh' (as root; first run ~10 min, then seconds)"
EM_AARCH64 = 183  # ELF e_machine
WHEEL_RE = re.compile(r"vllm_engine-[^-]+\.cpu-cp38-abi3-manylinux_2_(\d+)_aarch64\.whl")


def _cache() -> Path:
    """AARCH64_CACHE from ci/cross.sh, its one home."""
    out = subprocess.run(["bash", "-c", f'REPO={REPO}; source "$REPO/ci/cross.sh"; echo "$AARCH64_CACHE"'],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


ROOTFS = _cache() / "rootfs"


def _chroot_missing() -> str | None:
    if NATIVE:
        return None
    if os.geteuid() != 0:
        return f"chroot needs root; {SETUP}"
    if not (ROOTFS / ".vllm-rootfs-ready").is_file() or not (ROOTFS / ".vllm-packages").is_file():
        return f"no arm64 root file system with torch at {ROOTFS}; {SETUP}"
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").is_file():
        return f"qemu-aarch64 is not registered with binfmt_misc; {SETUP}"
    return None


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


class Aarch64:
    """Run commands on aarch64: in the chroot under qemu, or natively."""

    def __init__(self, scratch: Path):
        self.scratch = scratch  # as seen from this machine
        self.inside = Path("/") / scratch.relative_to(ROOTFS) if not NATIVE else scratch

    def run(self, script: str, check=True, timeout=1800) -> subprocess.CompletedProcess:
        env = {"OMP_NUM_THREADS": "2", "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root",
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
        cmd = ["/bin/sh", "-c", f"cd {self.inside} && {script}"]
        if not NATIVE:
            cmd = ["chroot", str(ROOTFS), *cmd]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"aarch64 command failed ({proc.returncode}): {script}\n"
                                 f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        return proc


@pytest.fixture(scope="session")
def aarch64_wheel(tmp_path_factory) -> Path:
    """The repaired aarch64 cpu wheel, built once per session (or taken from
    $VLLM_TEST_AARCH64_WHEEL when a caller has just built it)."""
    given = os.environ.get("VLLM_TEST_AARCH64_WHEEL")
    if given:
        return Path(given)
    if not NATIVE and not shutil.which("aarch64-linux-gnu-g++"):
        pytest.skip(f"no aarch64 cross compiler; {SETUP}")
    out = tmp_path_factory.mktemp("aarch64-wheelhouse")
    run(["bash", REPO / "ci" / "build-wheel.sh", "cpu", out, "--arch", "aarch64"],
        env={"PYTHON": sys.executable, "UV": UV}, cwd=REPO)
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def arm(aarch64_wheel, tmp_path_factory):
    """A fresh venv on aarch64 (seeing the root file system's torch) with the
    wheel installed by pip, and the test files copied beside it."""
    reason = _chroot_missing()
    if reason:
        pytest.skip(reason)
    if NATIVE:
        scratch = tmp_path_factory.mktemp("aarch64")
    else:
        # what ci/setup-aarch64.sh mounts; gone after a reboot
        if not _mounted(ROOTFS / "proc"):
            run(["mount", "-t", "proc", "proc", ROOTFS / "proc"])
        if not _mounted(ROOTFS / "dev"):
            run(["mount", "--bind", "/dev", ROOTFS / "dev"])
        scratch = ROOTFS / "tmp" / f"vllm-test-{uuid.uuid4().hex[:12]}"
        scratch.mkdir(parents=True)
    (scratch / "tests").mkdir()
    for name in ("test_ops.py", "test_engine.py", "helpers.py"):
        shutil.copy(REPO / "tests" / name, scratch / "tests" / name)
    shutil.copytree(REPO / "tools", scratch / "src" / "tools",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "wheel_index", scratch / "src" / "wheel_index",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(aarch64_wheel, scratch / aarch64_wheel.name)
    a = Aarch64(scratch)
    python = "/usr/bin/python3" if not NATIVE else sys.executable
    a.run(f"{python} -m venv --system-site-packages venv && "
          f"venv/bin/python -m pip install -q --no-deps --no-index --disable-pip-version-check "
          f"./{aarch64_wheel.name}")
    yield a
    shutil.rmtree(scratch, ignore_errors=True)


# ---- the wheel itself (no emulation needed) ---------------------------------------

def test_wheel_is_an_honest_aarch64_manylinux_wheel(aarch64_wheel):
    assert WHEEL_RE.fullmatch(aarch64_wheel.name), aarch64_wheel.name
    with zipfile.ZipFile(aarch64_wheel) as z:
        so = z.read("engine/_C.abi3.so")
        info = json.loads(z.read("engine/_build_info.json"))
        wheel_meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    assert so[:4] == b"\x7fELF" and so[4] == 2  # 64-bit
    assert int.from_bytes(so[18:20], "little") == EM_AARCH64, "engine/_C.abi3.so is not AArch64"
    assert info["processor"] == "aarch64" and info["variant"] == "cpu"
    assert info["code_paths"] == ["cpu-neon", "cpu-neon_bf16"]
    assert info["torch_version"].split("+")[0] == info["torch_requirement"].split("==")[1].split("+")[0]
    assert re.search(r"^Tag: cp38-abi3-manylinux_2_\d+_aarch64$", wheel_meta, re.M), wheel_meta
    # auditwheel grafted nothing: torch's libraries and libgomp come from torch
    with zipfile.ZipFile(aarch64_wheel) as z:
        assert not [n for n in z.namelist() if ".libs/" in n], z.namelist()


# ---- under qemu ---------------------------------------------------------------------

def test_installed_wheel_runs_every_op_against_the_reference(arm):
    # both AArch64 code paths where the (emulated) CPU has them, fp32 and bf16
    proc = arm.run("venv/bin/python -c \"import torch; print(torch.ops._C.cpu_compiled_isas() "
                   "if __import__('engine') else '')\"")
    assert proc.stdout.split()[-1] == "neon_bf16,neon", proc.stdout
    proc = arm.run("venv/bin/python -m pytest -q -p no:cacheprovider -x tests/test_ops.py -rs")
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:]
    assert "[neon_bf16-" in proc.stdout or "neon_bf16" in arm.run(
        "venv/bin/python -m pytest -q -p no:cacheprovider --collect-only tests/test_ops.py").stdout


def test_greedy_output_matches_transformers(arm):
    proc = arm.run("venv/bin/python -m pytest -q -p no:cacheprovider -x "
                   "'tests/test_engine.py::test_greedy_matches_transformers[llama]' "
                   "'tests/test_engine.py::test_greedy_matches_transformers[qwen3]'")
    assert "2 passed" in proc.stdout, proc.stdout[-3000:]


def test_engine_env_reports_aarch64(arm):
    proc = arm.run("venv/bin/python -m engine.env --json")
    data = json.loads(proc.stdout)
    assert data["processor"] == "aarch64"
    assert data["code_paths"] == ["cpu-neon", "cpu-neon_bf16"]
    assert data["cpu_isa_in_use"] in ("neon_bf16", "neon")
    assert data["variant"] == "cpu" and data["extension"].startswith(str(arm.inside / "venv"))
    proc = arm.run("VLLM_CPU_ISA=neon venv/bin/python -m engine.env --json")
    assert json.loads(proc.stdout)["cpu_isa_in_use"] == "neon"


def test_precompiled_mode_on_aarch64_picks_the_aarch64_wheel(arm, two_arch_index):
    idx, commit, wheels = two_arch_index
    meta = (idx / commit / "cpu" / "metadata.json").read_text()
    (arm.scratch / "metadata.json").write_text(meta)
    proc = arm.run("cd src && ../venv/bin/python -c \"import json; "
                   "from tools.precompiled.select import pick_wheel; "
                   "w, url = pick_wheel(json.load(open('../metadata.json')), 'cpu', 'IDX', 'L'); "
                   "print(w['filename'])\"")
    assert proc.stdout.strip() == wheels["aarch64"].name


# ---- the index and uv ---------------------------------------------------------------

@pytest.fixture(scope="module")
def two_arch_index(cpu_wheel, aarch64_wheel, tmp_path_factory):
    """Both architectures' cpu wheels of one commit, published into one folder index."""
    from wheel_index.publish import publish
    from wheel_index.storage import open_storage

    commits = {json.loads(zipfile.ZipFile(w).read("engine/_build_info.json"))["git_commit"]
               for w in (cpu_wheel, aarch64_wheel)}
    assert len(commits) == 1, f"the two wheels come from different commits: {commits}"
    commit = commits.pop()
    idx = tmp_path_factory.mktemp("index")
    publish(open_storage(str(idx)), commit, [cpu_wheel], nightly=True, commit_time="1000",
            log=lambda m: None)
    publish(open_storage(str(idx)), commit, [aarch64_wheel], nightly=True, commit_time="1000",
            log=lambda m: None)
    return idx, commit, {"x86_64": cpu_wheel, "aarch64": aarch64_wheel}


def test_one_variant_level_holds_both_architectures(two_arch_index):
    from wheel_index.maintain import verify
    from wheel_index.storage import open_storage

    idx, commit, wheels = two_arch_index
    for level in (f"{commit}/cpu", "nightly/cpu"):
        listed = {w["filename"] for w in json.loads((idx / level / "metadata.json").read_text())["wheels"]}
        assert listed == {w.name for w in wheels.values()}, level
        page = (idx / level / "vllm-engine" / "index.html").read_text()
        assert all(w.name in page for w in wheels.values())
    assert verify(open_storage(str(idx)), log=lambda m: None) == []


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_uv_picks_the_wheel_of_the_machine(two_arch_index, machine, tmp_path):
    idx, commit, wheels = two_arch_index
    server = Server(idx)
    try:
        version = wheels[machine].name.split("-")[1]
        args = [UV, "pip", "install", "--no-deps", "--python-platform", f"{machine}-manylinux_2_28",
                "--python-version", "3.11", "--index-url", f"{server.url}/{commit}/cpu",
                f"vllm-engine=={version}"]
        env = {"UV_CACHE_DIR": str(tmp_path / "uv-cache")}
        dry = run([*args, "--dry-run", "--target", tmp_path / "dry", "-v"], env=env)
        assert wheels[machine].name in dry.stderr + dry.stdout or "Would install" in dry.stderr
        run([*args, "--target", tmp_path / "t"], env=env)
        so = (tmp_path / "t" / "engine" / "_C.abi3.so").read_bytes()
        assert int.from_bytes(so[18:20], "little") == (EM_AARCH64 if machine == "aarch64" else 62)
    finally:
        server.close()


def test_verify_reports_a_level_missing_one_architecture(cpu_wheel, aarch64_wheel, tmp_path):
    from wheel_index.maintain import verify
    from wheel_index.publish import publish
    from wheel_index.storage import open_storage

    commit = json.loads(zipfile.ZipFile(cpu_wheel).read("engine/_build_info.json"))["git_commit"]
    other = "f" * 40
    storage = open_storage(str(tmp_path / "idx"))
    publish(storage, commit, [cpu_wheel, aarch64_wheel], commit_time="1000", log=lambda m: None)
    # a later commit whose aarch64 job did not publish: x86_64 only (the same
    # wheel file, renamed into that commit, stands in for its build)
    lone = tmp_path / cpu_wheel.name
    _rewrite_commit(cpu_wheel, lone, other)
    publish(storage, other, [lone], commit_time="2000", log=lambda m: None)
    problems = verify(storage, log=lambda m: None)
    assert any(p.startswith(f"{other}/cpu") and "aarch64" in p for p in problems), problems
    assert not any(p.startswith(f"{commit}/cpu") for p in problems), problems


def _rewrite_commit(src: Path, dest: Path, commit: str) -> None:
    """A copy of the wheel whose build info names another commit (RECORD kept valid)."""
    import base64
    import hashlib

    with zipfile.ZipFile(src) as zin:
        items = {n: zin.read(n) for n in zin.namelist()}
    info = json.loads(items["engine/_build_info.json"])
    info["git_commit"] = commit
    items["engine/_build_info.json"] = json.dumps(info).encode()
    record = next(n for n in items if n.endswith(".dist-info/RECORD"))
    lines = []
    for line in items[record].decode().splitlines():
        name = line.split(",")[0]
        if name in items and name != record:
            digest = base64.urlsafe_b64encode(hashlib.sha256(items[name]).digest()).rstrip(b"=")
            line = f"{name},sha256={digest.decode()},{len(items[name])}"
        lines.append(line)
    items[record] = ("\n".join(lines) + "\n").encode()
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for n, data in items.items():
            zout.writestr(n, data)
