"""A published index served the way S3's REST and website endpoints (and CDNs
in front of them) serve it, reading a literal '+' in a URL path as a space:
pip, uv, precompiled mode and bisect still install from it, because every link
and path the index writes is percent-encoded."""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from helpers import UV, PlusAsSpaceServer, make_wheel, run
from tools.errors import UserError
from tools.precompiled import install_kernels
from tools.precompiled.fetch import fetch
from wheel_index import maintain
from wheel_index.publish import publish
from wheel_index.storage import LocalStorage

A = "a" * 40
VERSION = "0.1.dev3+g1234567.cpu"


@pytest.fixture(scope="module")
def s3_like(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plus")
    w = make_wheel(tmp / "w", VERSION, commit=A)
    with zipfile.ZipFile(w, "a") as zf:  # kernels, so precompiled mode can take them
        zf.writestr("engine/_C.abi3.so", b"\x7fELF not really")
    idx = tmp / "index"
    publish(LocalStorage(idx), A, [w], nightly=True, commit_time="100", log=lambda m: None)
    server = PlusAsSpaceServer(idx)
    yield server.url, w, idx
    server.close()


def status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_server_reads_plus_as_space_and_the_index_never_writes_one(s3_like):
    url, w, idx = s3_like
    base = f"{url}/{A}/cpu/vllm-engine"
    assert status(f"{base}/{w.name}") == 404  # what every link with a literal '+' got
    assert status(f"{base}/{w.name.replace('+', '%2B')}") == 200
    for page in idx.rglob("index.html"):
        assert "+" not in "".join(p.split('"')[0] for p in page.read_text().split('href="')[1:])
    for doc in idx.rglob("metadata.json"):
        assert all("+" not in w["path"] for w in json.loads(doc.read_text())["wheels"])
    assert maintain.verify(LocalStorage(idx), log=lambda m: None) == []


def _installed(target: Path) -> str:
    (dist,) = target.glob("vllm_engine-*.dist-info")
    return dist.name.removeprefix("vllm_engine-").removesuffix(".dist-info")


def test_uv_installs_through_it(s3_like, tmp_path):
    url, _, _ = s3_like
    run([UV, "pip", "install", "--target", tmp_path / "t", "--index-url", f"{url}/nightly/cpu",
         "vllm-engine"], env={"UV_CACHE_DIR": str(tmp_path / "cache")})
    assert _installed(tmp_path / "t") == VERSION


def test_pip_installs_through_it(s3_like, tmp_path):
    # pip re-quotes the path of every link it reads ('+' as %2B) so it would cope
    # with a literal '+' too; this guards the pages and JSON it reads, not the '+'.
    url, _, _ = s3_like
    run([sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--target",
         tmp_path / "t", "--index-url", f"{url}/{A}/cpu", "--no-deps", f"vllm-engine=={VERSION}"],
        env={"PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert _installed(tmp_path / "t") == VERSION


def test_precompiled_mode_installs_through_it(s3_like, tmp_path):
    url, w, _ = s3_like
    root = tmp_path / "src"
    root.mkdir()
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": url, "VLLM_PRECOMPILED_WHEEL_COMMIT": "nightly",
           "VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu", "VLLM_PRECOMPILED_CACHE": str(tmp_path / "c")}
    choice = install_kernels(root, env, log=lambda m: None)
    assert choice.commit == A and choice.filename == w.name and "%2B" in choice.url
    assert (root / "engine" / "_C.abi3.so").read_bytes() == b"\x7fELF not really"
    # the cached copy carries the real file name, decoded
    assert list((tmp_path / "c" / choice.sha256).glob("*.whl"))[0].name == w.name


def test_bisect_reads_it(s3_like, tmp_path):
    from tools.bisect import Installer

    url, w, _ = s3_like
    inst = Installer.__new__(Installer)  # only the index-reading half; no environment made
    inst.index, inst.variant = url, "cpu"
    found = inst.wheel(A)
    assert found is not None and "%2B" in found[0]
    env = {"VLLM_PRECOMPILED_CACHE": str(tmp_path / "c")}
    assert fetch(*found, env, log=lambda m: None).name == w.name


def test_a_folder_index_is_read_decoded(s3_like, tmp_path):
    """The same metadata.json read from the folder: the paths are decoded."""
    _, w, idx = s3_like
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": str(idx), "VLLM_PRECOMPILED_WHEEL_COMMIT": A,
           "VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu", "VLLM_PRECOMPILED_CACHE": str(tmp_path / "c")}
    (tmp_path / "src").mkdir()
    choice = install_kernels(tmp_path / "src", env, log=lambda m: None)
    assert Path(choice.url).is_file() and Path(choice.url).name == w.name


def test_a_cache_that_is_not_a_folder_is_named(s3_like, tmp_path):
    url, _, _ = s3_like
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "src").mkdir()
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": url, "VLLM_PRECOMPILED_WHEEL_COMMIT": "nightly",
           "VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu", "VLLM_PRECOMPILED_CACHE": str(tmp_path / "file")}
    with pytest.raises(UserError, match="set VLLM_PRECOMPILED_CACHE to a writable folder"):
        install_kernels(tmp_path / "src", env, log=lambda m: None)
    assert not (tmp_path / "src" / "engine").exists()
