"""The sdist and the wheel as a release engineer checks them: what the sdist
holds, that a wheel builds from it with exactly its version, and what twine,
check-wheel-contents and abi3audit say."""
from __future__ import annotations

import email.parser
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers import REPO, UV, copy_source_tree, dev_tool, run




def _metadata(text: str):
    return email.parser.HeaderParser().parsestr(text)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """A cpu sdist of a copy of this checkout."""
    tmp = tmp_path_factory.mktemp("sdist")
    src = copy_source_tree(tmp / "src")
    run([UV, "build", "-q", "--sdist", "--no-build-isolation", "--python", sys.executable,
         "--out-dir", tmp / "dist", src], env={"VLLM_TARGET_DEVICE": "cpu"})
    (path,) = (tmp / "dist").glob("*.tar.gz")
    return path


def _pkg_info(sdist: Path):
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        return _metadata(tf.extractfile(f"{top}/PKG-INFO").read().decode()), tf.getnames()


def test_sdist_holds_what_a_build_needs_and_the_license(sdist):
    meta, names = _pkg_info(sdist)
    rel = {n.split("/", 1)[1] for n in names if "/" in n}
    for needed in ("requirements/build/cpu.txt", "requirements/build/common.txt",
                   "requirements/torch/cpu.txt", "requirements/cpu.txt", "CMakeLists.txt",
                   "LICENSE", "docs/install.md", "tools/build_backend.py", "csrc/module.c"):
        assert needed in rel, needed
    assert not [n for n in rel if n.startswith(("build/", ".venv", "dist/", "index/"))]
    assert meta["Version"].endswith(".cpu") and meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    assert meta.get_all("Project-URL")
    assert "Apache License" in (REPO / "LICENSE").read_text()


def test_long_description_is_for_users_and_stays_in_the_repository(sdist):
    meta, _ = _pkg_info(sdist)
    body = meta.get_payload()
    assert body.startswith("# vllm-engine") and "uv pip install vllm-engine" in body
    assert "ci/setup-dev.sh" not in body  # not the developer README
    assert not re.search(r"https?://", body), "the description links outside the repository"
    assert "../" not in body


def test_twine_accepts_the_sdist(sdist):
    res = run([dev_tool("twine"), "check", "--strict", sdist], check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_sdist_refuses_another_target_in_one_line(sdist, tmp_path):
    res = run([UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
               "--out-dir", tmp_path, sdist], env={"VLLM_TARGET_DEVICE": "empty"}, check=False)
    assert res.returncode != 0
    lines = [l for l in res.stderr.splitlines() if "vllm-engine build: error" in l]
    assert len(lines) == 1 and "made for the cpu variant" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_wheel_from_the_sdist_has_its_version_and_passes_the_checkers(sdist, tmp_path):
    # VLLM_TARGET_DEVICE unset: the sdist builds its own variant.
    env = {"VLLM_TARGET_DEVICE": "", "MAX_JOBS": "2"}
    run([UV, "build", "-q", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "--out-dir", tmp_path, sdist], env=env)
    (wheel,) = tmp_path.glob("*.whl")
    sdist_meta, _ = _pkg_info(sdist)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = _metadata(zf.read(f"{dist_info}/METADATA").decode())
        assert f"{dist_info}/licenses/LICENSE" in names
    assert meta["Version"] == sdist_meta["Version"]
    assert meta.get_all("Requires-Dist") == sdist_meta.get_all("Requires-Dist")
    assert meta["License-File"] == "LICENSE" and "engine/_C.abi3.so" in names

    for tool in ("twine", "check-wheel-contents", "abi3audit"):
        dev_tool(tool)
    res = run(["bash", REPO / "ci" / "check-dist.sh", wheel, sdist], check=False,
              env={"PYTHON": sys.executable})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASSED" in res.stdout and "OK" in res.stdout and "stable ABI" in res.stdout


def test_check_dist_refuses_a_broken_wheel_in_one_line(tmp_path):
    bad = tmp_path / "vllm_engine-0.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    bad.write_text("not a zip")
    res = run(["bash", REPO / "ci" / "check-dist.sh", bad], check=False,
              env={"PYTHON": sys.executable})
    assert res.returncode == 1
    assert res.stderr.strip() == f"error: {bad} is not a readable wheel (zip archive); rebuild it"
