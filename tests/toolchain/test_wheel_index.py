"""wheel_index against both storages (a folder, and S3 through a real moto
server on loopback), with small synthetic wheels."""
from __future__ import annotations

import http.client
import json
import os
import re
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest

from helpers import Dying, Killed, make_wheel
from tools.errors import UserError
from wheel_index import maintain
from wheel_index.cli import main as cli
from wheel_index.layout import IMMUTABLE, NIGHTLY_PAGE
from wheel_index.publish import publish
from wheel_index.server import make_server
from wheel_index.storage import LocalStorage, S3Storage

A, B, C = "a" * 40, "b" * 40, "c" * 40


def snapshot(storage) -> dict[str, bytes]:
    return {k: storage.read(k) for k in storage.list("")} if storage.list_dirs("") else {}


def wheel(tmp_path, commit=A, version="0.1.dev3+g1234567.cpu", **kw) -> Path:
    return make_wheel(tmp_path / "w" / commit[:6], version, commit=commit, **kw)


def test_storage_contract(store, tmp_path):
    store.write_atomic("x/y/a.txt", b"one")
    store.write_atomic("x/y/a.txt", b"two")
    f = tmp_path / "blob"
    f.write_bytes(b"\0" * 5000)
    store.upload_file("x/z/b.whl", f)
    assert store.read("x/y/a.txt") == b"two" and store.read("missing") is None
    assert store.read("x/z/b.whl") == b"\0" * 5000 and store.read("x/z/c.whl") is None
    assert store.list("x") == ["x/y/a.txt", "x/z/b.whl"]
    assert store.list_dirs("") == ["x"] and store.list_dirs("x") == ["y", "z"]
    store.delete(["x/y/a.txt"])
    assert store.list("x") == ["x/z/b.whl"]


def test_publish_writes_pep503_691_658_pages(store, tmp_path):
    x86 = wheel(tmp_path)
    arm = wheel(tmp_path, platform="manylinux_2_34_aarch64")
    r = publish(store, A, [x86, arm], nightly=True, commit_time="100", log=lambda m: None)
    assert sorted(r.stored) == sorted([x86.name, arm.name])
    page = store.read(f"{A}/cpu/vllm-engine/index.html").decode()
    for w in (x86, arm):  # percent-encoded: S3 and CDNs read a literal '+' as a space
        assert f"{quote(w.name)}#sha256=" in page and "%2B" in quote(w.name)
    assert "+" not in "".join(re.findall(r'href="([^"]+)"', page))
    assert 'data-requires-python="&gt;=3.10"' in page
    assert "data-core-metadata=\"sha256=" in page and "data-dist-info-metadata=\"sha256=" in page
    doc = json.loads(store.read(f"{A}/cpu/vllm-engine/index.json"))
    assert doc["meta"]["api-version"] == "1.1" and doc["versions"] == ["0.1.dev3+g1234567.cpu"]
    assert {f["size"] for f in doc["files"]} == {x86.stat().st_size, arm.stat().st_size}
    assert all(f["upload-time"].endswith("Z") and f["core-metadata"] for f in doc["files"])
    assert store.read(f"{A}/cpu/vllm-engine/{x86.name}.metadata").startswith(b"Metadata-Version")
    meta = json.loads(store.read(f"{A}/cpu/metadata.json"))
    assert {w["platform_tag"] for w in meta["wheels"]} == {"manylinux_2_34_x86_64",
                                                          "manylinux_2_34_aarch64"}
    assert meta["wheels"][0]["path"].startswith("vllm-engine/") and meta["commit"] == A
    assert all("%2B" in w["path"] and "+" not in w["path"] for w in meta["wheels"])
    assert all("%2B" in f["url"] and "+" not in f["url"] for f in doc["files"])
    nightly = json.loads(store.read("nightly/cpu/metadata.json"))
    assert nightly["commit"] == A and nightly["wheels"][0]["path"].startswith(f"../../{A}/")
    # stored once: nightly links to the commit's file, it holds no copy
    assert not [k for k in store.list("nightly") if k.endswith(".whl")]
    assert maintain.verify(store, log=lambda m: None) == []
    if isinstance(store, S3Storage):
        head = store.client.head_object(Bucket=store.bucket, Key=f"wheels/{A}/cpu/vllm-engine/")
        assert head["ContentType"].startswith("text/html")
        wh = store.client.head_object(Bucket=store.bucket,
                                      Key=f"wheels/{A}/cpu/vllm-engine/{x86.name}")
        assert wh["CacheControl"] == IMMUTABLE
        nh = store.client.head_object(Bucket=store.bucket, Key="wheels/nightly/cpu/vllm-engine/")
        assert nh["CacheControl"] == NIGHTLY_PAGE


def test_default_variant_views_and_release(store, tmp_path):
    cuda = wheel(tmp_path, version="1.2.0")  # a release of the main CUDA variant: no suffix
    publish(store, A, [cuda], nightly=True, release=True, commit_time="100", log=lambda m: None)
    for view in (f"{A}/cu130", A, "nightly/cu130", "nightly", "1.2.0/cu130", "1.2.0"):
        assert cuda.name in store.read(f"{view}/vllm-engine/index.html").decode(), view
    assert maintain.verify(store, log=lambda m: None) == []
    with pytest.raises(UserError, match="--release needs wheels of one tagged release"):
        publish(store, B, [wheel(tmp_path, commit=B)], release=True, commit_time="1")


def test_publishing_again_changes_nothing(store, tmp_path):
    w = wheel(tmp_path)
    publish(store, A, [w], nightly=True, commit_time="100", log=lambda m: None)
    before = snapshot(store)
    r = publish(store, A, [w], nightly=True, commit_time="100", log=lambda m: None)
    assert r.stored == [] and r.unchanged == [w.name] and r.pages_written == []
    assert snapshot(store) == before


def test_different_bytes_are_refused_unless_forced(store, tmp_path):
    w = wheel(tmp_path)
    publish(store, A, [w], commit_time="100", log=lambda m: None)
    before = snapshot(store)
    other = make_wheel(tmp_path / "other", "0.1.dev3+g1234567.cpu", commit=A, body="VALUE = 2\n")
    with pytest.raises(UserError, match="already published with different bytes.*--force"):
        publish(store, A, [other], commit_time="100")
    assert snapshot(store) == before
    logged = []
    publish(store, A, [other], force=True, commit_time="100", log=logged.append)
    assert any("--force: replacing" in m for m in logged)
    assert maintain.verify(store, log=lambda m: None) == []


def _corrupt(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _text_file(t: Path) -> Path:
    (t / "notes.whl.txt").write_text("hi")
    return t / "notes.whl.txt"


def _renamed(t: Path) -> Path:
    """A wheel whose file name claims another version than its METADATA."""
    return wheel(t).rename(t / "vllm_engine-0.1.dev9+g1.cpu-cp38-abi3-manylinux_2_34_x86_64.whl")


def _member(tmp_path, name, text="x") -> Path:
    w = wheel(tmp_path)
    with zipfile.ZipFile(w, "a") as zf:
        zf.writestr(name, text)
    return w


@pytest.mark.parametrize("make,commit,message", [
    (_text_file, A, "not a wheel"),
    (lambda t: _corrupt(wheel(t)), A, "corrupt wheel"),
    (lambda t: make_wheel(t / "o", "1.0+cpu", name="other_project"), A, "this index holds only"),
    (_renamed, A, "METADATA says"),
    (lambda t: wheel(t), "a" * 39, "not a full commit hash"),
    (lambda t: wheel(t), "A" * 40, "not a full commit hash"),
    (lambda t: make_wheel(t / "v", "0.1.dev3+g1234567.cpu", variant="cu130", commit=A), A,
     "build info .* says 'cu130'"),
    (lambda t: wheel(t, commit=B), A, f"built from commit {B}"),
    (lambda t: _member(t, "../../evil.py"), A, "unsafe member name"),
    (lambda t: make_wheel(t / "x", "0.1.dev3+g1234567.cpu7", commit=A), A, "names no known variant"),
])
def test_bad_input_is_refused_and_changes_nothing(store, tmp_path, make, commit, message):
    w = make(tmp_path)
    with pytest.raises(UserError, match=message):
        publish(store, commit, [w], commit_time="100")
    assert snapshot(store) == {}


def test_nightly_only_moves_forward(store, tmp_path):
    publish(store, B, [wheel(tmp_path, commit=B)], nightly=True, commit_time="200",
            log=lambda m: None)
    said = []
    r = publish(store, A, [wheel(tmp_path, commit=A)], nightly=True, commit_time="100",
                log=said.append)
    assert r.nightly_moved == {"cpu": False} and any("stays at" in m for m in said)
    assert json.loads(store.read("nightly/cpu/metadata.json"))["commit"] == B
    publish(store, A, [wheel(tmp_path, commit=A)], nightly=True, allow_rewind=True,
            commit_time="100", log=lambda m: None)
    assert json.loads(store.read("nightly/cpu/metadata.json"))["commit"] == A


def _dangling(storage) -> list[str]:
    return [p for p in maintain.verify(storage, log=lambda m: None)
            if "does not list" not in p and "is missing" not in p]


def test_killed_publish_leaves_resolvable_links_and_rerun_completes(store, tmp_path):
    publish(store, A, [wheel(tmp_path, commit=A)], nightly=True, commit_time="100",
            log=lambda m: None)
    w = [wheel(tmp_path, commit=B), wheel(tmp_path, commit=B, platform="manylinux_2_34_aarch64")]
    for k in range(0, 30, 3):
        try:
            publish(Dying(store, k), B, w, nightly=True, commit_time="200", log=lambda m: None)
        except Killed:
            pass
        assert _dangling(store) == [], f"killed after {k} writes"
    publish(store, B, w, nightly=True, commit_time="200", log=lambda m: None)
    assert maintain.verify(store, log=lambda m: None) == []
    assert json.loads(store.read("nightly/cpu/metadata.json"))["commit"] == B


def test_concurrent_publishers_lose_nothing(store, tmp_path):
    jobs = [wheel(tmp_path, commit=A, platform=p) for p in
            ("manylinux_2_34_x86_64", "manylinux_2_34_aarch64")]
    jobs += [make_wheel(tmp_path / v, f"0.1.dev3+g1234567.{v}", commit=A) for v in
             ("cu129", "cu130", "rocm700", "xpu")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda w: publish(store, A, [w], nightly=True, commit_time="100",
                                        log=lambda m: None), jobs))
    assert maintain.verify(store, log=lambda m: None) == []
    cpu = store.read(f"{A}/cpu/vllm-engine/index.html").decode()
    assert jobs[0].name in cpu and jobs[1].name in cpu
    night = store.read("nightly/cpu/vllm-engine/index.html").decode()
    assert jobs[0].name in night and jobs[1].name in night
    for v in ("cu129", "cu130", "rocm700", "xpu"):
        assert store.read(f"nightly/{v}/metadata.json") is not None


def test_prune_keeps_nightly_and_releases(store, tmp_path):
    commits = [c * 40 for c in "12345"]
    release = make_wheel(tmp_path / "rel", "1.0.0+cpu", commit=commits[0])
    publish(store, commits[0], [release], release=True, commit_time="1", log=lambda m: None)
    for i, c in enumerate(commits[1:], 2):
        publish(store, c, [wheel(tmp_path, commit=c)], nightly=True, commit_time=str(i),
                log=lambda m: None)
    assert sorted(maintain.prune(store, keep_commits=2, dry_run=True, log=lambda m: None)) == \
        commits[1:3]
    assert len(maintain.published(store)) == 5
    removed = maintain.prune(store, keep_commits=2, log=lambda m: None)
    assert removed == [commits[2], commits[1]]  # newest first
    left = [p.commit for p in maintain.published(store)]
    assert left == [commits[4], commits[3], commits[0]]
    assert maintain.verify(store, log=lambda m: None) == []
    assert maintain.prune(store, keep_days=1, now=10 + 86400 * 2, log=lambda m: None) == [commits[3]]
    with pytest.raises(UserError, match="exactly one of"):
        maintain.prune(store)


def test_verify_finds_tampering_and_cli_exits_nonzero(tmp_path, capsys):
    idx = tmp_path / "index"
    w = wheel(tmp_path)
    assert cli(["publish", "--index", str(idx), "--commit", A, "--commit-time", "5", str(w)]) == 0
    assert cli(["verify", "--index", str(idx)]) == 0
    stored = idx / A / "cpu" / "vllm-engine" / w.name
    stored.write_bytes(stored.read_bytes() + b"tampered")
    assert cli(["verify", "--index", str(idx)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    stored.unlink()
    assert cli(["verify", "--index", str(idx)]) == 1
    assert "dangling link" in capsys.readouterr().out


def test_cli_ls_and_errors(tmp_path, capsys):
    idx = str(tmp_path / "index")
    cli(["publish", "--index", idx, "--commit", A, "--commit-time", "5", "--nightly",
         str(wheel(tmp_path))])
    cli(["publish", "--index", idx, "--commit", B, "--commit-time", "9", str(wheel(tmp_path, commit=B))])
    capsys.readouterr()
    assert cli(["ls", "--index", idx]) == 0
    out = capsys.readouterr().out
    assert out.index(B) < out.index(A) and "nightly/cpu" in out
    assert cli(["publish", "--index", idx, "--commit", "xyz", str(wheel(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert "not a full commit hash" in err and "Traceback" not in err
    assert cli(["ls", "--index", "ftp://x/y"]) == 1


# ---- serve -----------------------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    idx = tmp_path / "index"
    publish(LocalStorage(idx), A, [wheel(tmp_path)], nightly=True, commit_time="100",
            log=lambda m: None)
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", idx / "escape.txt")
    server = make_server(idx)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address, idx
    server.shutdown()
    server.server_close()


def get(addr, path, method="GET", headers=None):
    conn = http.client.HTTPConnection(*addr, timeout=10)
    conn.request(method, path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r, body


def test_serve_pages_json_negotiation_and_cache_headers(served):
    addr, idx = served
    assert addr[0] == "127.0.0.1"
    r, body = get(addr, "/nightly/cpu/vllm-engine/")
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/html")
    assert r.getheader("Cache-Control") == NIGHTLY_PAGE and b"#sha256=" in body
    r, body = get(addr, "/nightly/cpu/vllm-engine/",
                  headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.5"})
    assert r.getheader("Content-Type") == "application/vnd.pypi.simple.v1+json"
    assert json.loads(body)["meta"]["api-version"] == "1.1"
    href = json.loads(body)["files"][0]["url"]
    from urllib.parse import urljoin  # as pip and uv resolve a relative link (already encoded)

    r, _ = get(addr, urljoin("/nightly/cpu/vllm-engine/", href))
    assert r.status == 200 and r.getheader("Cache-Control") == IMMUTABLE
    r, _ = get(addr, "/nightly/cpu/vllm-engine", method="HEAD")
    assert r.status == 301


@pytest.mark.parametrize("path", ["/../secret.txt", "/%2e%2e/secret.txt", "/nightly/%2E%2E/%2e%2e/secret.txt",
                                  "/nightly/..%2f..%2fsecret.txt", "/a%00b"])
def test_serve_never_leaves_its_root(served, path):
    r, body = get(served[0], path)
    assert r.status == 400 and b"secret" not in body


def test_serve_a_link_out_of_the_root_is_not_found(served):
    r, body = get(served[0], "/escape.txt")
    assert r.status == 404 and b"secret" not in body


def test_serve_answers_bad_requests_with_4xx(served):
    assert get(served[0], "/nope/")[0].status == 404
    assert get(served[0], "/nightly/cpu/", method="POST")[0].status == 405
    assert get(served[0], "/nightly/cpu/", method="DELETE")[0].status == 405
