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


class Aarch64:
    """Run commands on aarch64: in the chroot under qemu, or natively."""

    def __init__(self, scratch: Path):
        self.scratch = scratch  # as seen from this machine
        self.inside = Path("/") / scratch.relative_to(ROOTFS) if not NATIVE else scratch

    def run(self, script: str, check=True, timeout=3000) -> subprocess.CompletedProcess:
        env = {"OMP_NUM_THREADS": "2", "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root",
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}
        cmd = ["/bin/sh", "-c", f"cd {self.inside} && {script}"]
        if not NATIVE:
            cmd = [shutil.which("chroot") or "/usr/sbin/chroot", str(ROOTFS), *cmd]
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
def arm_results(aarch64_wheel, request, tmp_path_factory):
    """One pytest session on aarch64 against the installed wheel: test_ops.py
    and test_gguf_int8_kernel.py (every op on both ARM code paths) and
    tests/native/inside_aarch64.py (greedy output against transformers,
    `engine env`, the ISA switch, precompiled mode's pick). Returns {test id:
    (outcome, message)} from its JUnit XML."""
    reason = _chroot_missing()
    if reason:
        pytest.skip(reason)
    if NATIVE:
        scratch = tmp_path_factory.mktemp("aarch64")
    else:
        run(["bash", REPO / "ci" / "aarch64-mounts.sh"])  # gone after a reboot
        scratch = ROOTFS / "tmp" / f"vllm-test-{uuid.uuid4().hex[:12]}"
        scratch.mkdir(parents=True)
    try:
        (scratch / "tests").mkdir()
        # flat, as one folder: they import one another by module name
        for name in ("kernels/test_ops.py", "kernels/test_gguf_int8_kernel.py",
                     "engine/test_engine.py", "helpers.py", "gguf_files.py"):
            shutil.copy(REPO / "tests" / name, scratch / "tests" / Path(name).name)
        shutil.copy(REPO / "tests" / "native" / "inside_aarch64.py", scratch / "tests")
        for pkg in ("tools", "wheel_index"):
            shutil.copytree(REPO / pkg, scratch / "src" / pkg,
                            ignore=shutil.ignore_patterns("__pycache__"))
        if NATIVE:  # no x86_64 wheel to choose from: the aarch64 one alone
            idx = tmp_path_factory.mktemp("index")
            commit = _commit(aarch64_wheel)
            _publish(idx, commit, [aarch64_wheel])
        else:
            idx, commit, _ = request.getfixturevalue("two_arch_index")
        shutil.copy(idx / commit / "cpu" / "metadata.json", scratch / "metadata.json")
        a = Aarch64(scratch)
        python = sys.executable if NATIVE else "/usr/bin/python3"
        # A fresh venv that sees the root file system's torch and test tools.
        # pip under qemu costs a minute; uv installs for the aarch64 platform
        # from outside instead, checking the wheel's tags against it.
        a.run(f"{python} -m venv --without-pip --system-site-packages venv")
        site = scratch / "venv" / "lib" / f"python{_aarch64_python_version()}" / "site-packages"
        run([UV, "pip", "install", "-q", "--no-deps", "--python-platform", "aarch64-manylinux_2_28",
             "--python-version", _aarch64_python_version(), "--target", site, aarch64_wheel])
        proc = a.run("venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=results.xml "
                     "tests/inside_aarch64.py tests/test_ops.py tests/test_gguf_int8_kernel.py",
                     check=False)
        if not (scratch / "results.xml").is_file():
            raise AssertionError(f"pytest on aarch64 did not run:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return _junit(scratch / "results.xml")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _aarch64_python_version() -> str:
    if NATIVE:
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = subprocess.run(["bash", "-c", f'REPO={REPO}; source "$REPO/ci/cross.sh"; echo "$AARCH64_PYTHON_VERSION"'],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _junit(path: Path) -> dict[str, tuple[str, str]]:
    import xml.etree.ElementTree as ET

    results = {}
    for case in ET.parse(path).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, message = tag, (el.get("message") or "") + "\n" + (el.text or "")[-3000:]
                break
        results[test_id] = outcome, message
    return results


def _select(results, prefix, may_skip=lambda test_id, message: False):
    chosen = {k: v for k, v in results.items() if k.startswith(prefix)}
    assert chosen, f"no {prefix} tests ran on aarch64; ran: {sorted(results)[:20]}"
    bad = {k: v for k, v in chosen.items()
           if v[0] != "passed" and not (v[0] == "skipped" and may_skip(k, v[1]))}
    assert not bad, "\n".join(f"{k}: {o}: {m}" for k, (o, m) in sorted(bad.items())[:5])
    return chosen


# ---- the wheel itself (no emulation needed) ---------------------------------------

def test_wheel_is_an_honest_aarch64_manylinux_wheel(aarch64_wheel):
    assert WHEEL_RE.fullmatch(aarch64_wheel.name), aarch64_wheel.name
    with zipfile.ZipFile(aarch64_wheel) as z:
        so = z.read("engine/_C.abi3.so")
        info = json.loads(z.read("engine/_build_info.json"))
        wheel_meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
        names = z.namelist()
    assert so[:4] == b"\x7fELF" and so[4] == 2  # 64-bit
    assert int.from_bytes(so[18:20], "little") == EM_AARCH64, "engine/_C.abi3.so is not AArch64"
    assert info["processor"] == "aarch64" and info["variant"] == "cpu"
    assert info["code_paths"] == ["cpu-neon", "cpu-neon_bf16"]
    assert info["torch_version"].split("+")[0] == info["torch_requirement"].split("==")[1].split("+")[0]
    assert re.search(r"^Tag: cp38-abi3-manylinux_2_\d+_aarch64$", wheel_meta, re.M), wheel_meta
    # auditwheel grafted nothing: torch's libraries and libgomp come from torch
    assert not [n for n in names if ".libs/" in n], names


# ---- under qemu ---------------------------------------------------------------------

def _no_neon_linear(test_id: str, message: str) -> bool:
    """The panel linear kernel is x86-only: on NEON its tests skip, saying so."""
    return "::test_linear" in test_id and "has no panel linear kernel" in message


def test_every_op_on_both_arm_code_paths_matches_the_reference(arm_results):
    ops = _select(arm_results, "tests.test_ops::", _no_neon_linear)
    for isa in ("neon_bf16", "neon"):
        assert any(f"[{isa}-" in k for k in ops), f"no op test ran on the {isa} path"
    for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary", "reshape_and_cache",
               "paged_attention"):
        assert any(op in k for k in ops), f"no {op} test ran"


def test_gguf_int8_kernel_on_both_arm_code_paths(arm_results):
    """GGUF's int8 product (NEON: SDOT on neon_bf16, widening multiplies on neon)
    against engine.reference on every bit width, with the packer the engine loads by."""
    cases = _select(arm_results, "tests.test_gguf_int8_kernel::",
                    lambda test_id, message: "take groups of whole" in message)
    for isa in ("neon_bf16", "neon"):
        ran = [k for k, (outcome, _) in cases.items() if f"[{isa}-" in k and outcome == "passed"]
        assert any("test_matches_reference" in k for k in ran), f"no gguf_int8 case ran on {isa}"
    # and a GGUF file's model on it, greedy output equal to the reference product's
    _select(arm_results, "tests.inside_aarch64::test_gguf_layers_run_the_int8_kernel")


def test_greedy_output_matches_transformers(arm_results):
    # see inside_aarch64.py: equal to the reference-op engine on every prompt, and
    # to transformers wherever torch's own aarch64 numerics agree with it
    _select(arm_results, "tests.inside_aarch64::test_greedy_output_matches_transformers")


def test_engine_env_and_isa_choice_on_aarch64(arm_results):
    _select(arm_results, "tests.inside_aarch64::test_engine_env")
    _select(arm_results, "tests.inside_aarch64::test_run_time_choice_of_the_arm_code_path")
    _select(arm_results, "tests.inside_aarch64::test_this_is_the_installed_aarch64_wheel")


def test_precompiled_mode_on_aarch64_picks_the_aarch64_wheel(arm_results):
    _select(arm_results, "tests.inside_aarch64::test_precompiled_mode_picks_the_aarch64_wheel")


# ---- the index and uv ---------------------------------------------------------------

def _commit(wheel: Path) -> str:
    return json.loads(zipfile.ZipFile(wheel).read("engine/_build_info.json"))["git_commit"]


def _publish(idx: Path, commit: str, wheels: list[Path], commit_time="1000"):
    from wheel_index.publish import publish
    from wheel_index.storage import open_storage

    publish(open_storage(str(idx)), commit, wheels, nightly=True, commit_time=commit_time,
            log=lambda m: None)


@pytest.fixture(scope="module")
def two_arch_index(aarch64_wheel, request, tmp_path_factory):
    """Both architectures' cpu wheels of one commit, published (by two
    publishers, as two CI jobs would) into one folder index."""
    if NATIVE:
        pytest.skip("needs the x86_64 wheel too, which is built on x86_64 machines")
    cpu_wheel = request.getfixturevalue("cpu_wheel")
    commits = {_commit(w) for w in (cpu_wheel, aarch64_wheel)}
    assert len(commits) == 1, f"the two wheels come from different commits: {commits}"
    commit = commits.pop()
    idx = tmp_path_factory.mktemp("index")
    _publish(idx, commit, [cpu_wheel])
    _publish(idx, commit, [aarch64_wheel])
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


# aarch64 as the issue asks (manylinux_2_28: RHEL 8 class); x86_64 at the tag
# this Debian 12 builder gives it (see "The wheels")
@pytest.mark.parametrize("machine,platform_tag", [("aarch64", "aarch64-manylinux_2_28"),
                                                  ("x86_64", "x86_64-manylinux_2_34")])
def test_uv_picks_the_wheel_of_the_machine(two_arch_index, machine, platform_tag, tmp_path):
    idx, commit, wheels = two_arch_index
    server = Server(idx)
    try:
        version = wheels[machine].name.split("-")[1]
        args = [UV, "pip", "install", "--no-deps", "--python-platform", platform_tag,
                "--python-version", "3.11", "--index-url", f"{server.url}/{commit}/cpu",
                f"vllm-engine=={version}"]
        env = {"UV_CACHE_DIR": str(tmp_path / "uv-cache")}
        dry = run([*args, "--dry-run", "--target", tmp_path / "dry", "-v"], env=env)
        assert f"Selecting: vllm-engine=={version} [compatible] ({wheels[machine].name})" \
            in dry.stderr, dry.stderr[-3000:]
        assert "Would install 1 package" in dry.stderr
        run([*args, "--target", tmp_path / "t"], env=env)
        so = (tmp_path / "t" / "engine" / "_C.abi3.so").read_bytes()
        assert int.from_bytes(so[18:20], "little") == (EM_AARCH64 if machine == "aarch64" else 62)
    finally:
        server.close()


def test_verify_reports_a_level_missing_one_architecture(two_arch_index, tmp_path):
    from wheel_index.maintain import verify
    from wheel_index.storage import open_storage

    _, commit, wheels = two_arch_index
    other = "f" * 40
    idx = tmp_path / "idx"
    _publish(idx, commit, list(wheels.values()))
    # a later commit whose aarch64 job did not publish: x86_64 only (the same
    # wheel, its build info naming that commit, stands in for its build)
    lone = tmp_path / wheels["x86_64"].name
    _rewrite_commit(wheels["x86_64"], lone, other)
    _publish(idx, other, [lone], commit_time="2000")
    problems = verify(open_storage(str(idx)), log=lambda m: None)
    assert any(p.startswith(f"{other}/cpu") and "aarch64 wheel is missing" in p for p in problems), problems
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
