"""`wheel_index serve` as clients and caches use it: byte ranges, HEAD, ETag
and Last-Modified with 304s, PEP 691 negotiation with Vary, PEP 503 name
redirects, a capped thread pool, flat memory while streaming, Ctrl-C."""
from __future__ import annotations

import email.utils
import http.client
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import REPO, free_port, make_wheel
from wheel_index.layout import HTML_CT, SIMPLE_JSON_CT
from wheel_index.publish import publish
from wheel_index.server import make_server, negotiate
from wheel_index.storage import LocalStorage

A = "a" * 40
V1_HTML = "application/vnd.pypi.simple.v1+html"


@pytest.fixture
def served(tmp_path):
    idx = tmp_path / "index"
    w = make_wheel(tmp_path / "w", "0.1.dev3+g1234567.cpu", commit=A)
    publish(LocalStorage(idx), A, [w], nightly=True, commit_time="100", log=lambda m: None)
    blob = idx / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 40)  # 10240 bytes, every offset recognisable
    server = make_server(idx, threads=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, idx, w
    server.shutdown()
    server.server_close()


def get(server, path, method="GET", headers=None):
    conn = http.client.HTTPConnection(*server.server_address, timeout=10)
    conn.request(method, path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r, body


def test_byte_ranges(served):
    server, idx, _ = served
    data = (idx / "blob.bin").read_bytes()
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=100-199"})
    assert r.status == 206 and body == data[100:200]
    assert r.getheader("Content-Range") == f"bytes 100-199/{len(data)}"
    assert r.getheader("Content-Length") == "100"
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=-16"})  # what pip asks first
    assert r.status == 206 and body == data[-16:]
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=10000-"})
    assert r.status == 206 and body == data[10000:]
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=0-999999"})
    assert r.status == 206 and body == data
    r, body = get(server, "/blob.bin", headers={"Range": f"bytes={len(data)}-"})
    assert r.status == 416 and r.getheader("Content-Range") == f"bytes */{len(data)}"
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=0-1,5-6"})  # may be ignored
    assert r.status == 200 and body == data
    r, body = get(server, "/blob.bin")
    assert r.status == 200 and body == data and r.getheader("Accept-Ranges") == "bytes"


def test_head_has_headers_and_no_body(served):
    server, idx, w = served
    path = f"/{A}/cpu/vllm-engine/{w.name.replace('+', '%2B')}"
    r, body = get(server, path, method="HEAD")
    assert r.status == 200 and body == b""
    assert r.getheader("Content-Length") == str(w.stat().st_size)
    assert r.getheader("ETag") and r.getheader("Last-Modified")
    # the connection is still usable after a HEAD: no stray body was sent
    conn = http.client.HTTPConnection(*server.server_address, timeout=10)
    conn.request("HEAD", path)
    conn.getresponse().read()
    conn.request("GET", "/blob.bin")
    assert conn.getresponse().read() == (idx / "blob.bin").read_bytes()
    conn.close()


def test_etag_and_last_modified_give_304(served):
    server, _, _ = served
    r, _ = get(server, "/blob.bin")
    etag, modified = r.getheader("ETag"), r.getheader("Last-Modified")
    r, body = get(server, "/blob.bin", headers={"If-None-Match": etag})
    assert r.status == 304 and body == b"" and r.getheader("ETag") == etag
    r, _ = get(server, "/blob.bin", headers={"If-None-Match": '"other", ' + etag})
    assert r.status == 304
    r, _ = get(server, "/blob.bin", headers={"If-None-Match": '"other"'})
    assert r.status == 200
    r, _ = get(server, "/blob.bin", headers={"If-Modified-Since": modified})
    assert r.status == 304
    r, _ = get(server, "/blob.bin", headers={
        "If-Modified-Since": email.utils.formatdate(1000, usegmt=True)})
    assert r.status == 200
    # a Range whose If-Range names another version gets the whole file
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=0-9", "If-Range": '"old"'})
    assert r.status == 200 and len(body) == 10240
    r, body = get(server, "/blob.bin", headers={"Range": "bytes=0-9", "If-Range": etag})
    assert r.status == 206 and len(body) == 10
    # the two representations of a page never share an ETag
    html, _ = get(server, "/nightly/cpu/vllm-engine/")
    js, _ = get(server, "/nightly/cpu/vllm-engine/", headers={"Accept": SIMPLE_JSON_CT})
    assert html.getheader("ETag") != js.getheader("ETag")


@pytest.mark.parametrize("accept,ctype", [
    ("", HTML_CT),
    ("*/*", HTML_CT),
    ("text/html", HTML_CT),
    (SIMPLE_JSON_CT, SIMPLE_JSON_CT),
    ("application/vnd.pypi.simple.latest+json", SIMPLE_JSON_CT),
    (V1_HTML, V1_HTML),
    ("application/vnd.pypi.simple.latest+html", V1_HTML),
    # what uv and pip send
    (f"{SIMPLE_JSON_CT}, {V1_HTML};q=0.2, text/html;q=0.01", SIMPLE_JSON_CT),
    (f"{SIMPLE_JSON_CT};q=0.1, text/html", HTML_CT),
    ("application/*;q=0.5, text/html;q=0.4", V1_HTML),  # a tie of application/ types: HTML
    (f"application/*, {V1_HTML};q=0", SIMPLE_JSON_CT),
    ("image/png", HTML_CT),
])
def test_negotiation(served, accept, ctype):
    assert negotiate(accept) == ctype
    server, _, _ = served
    for path in ("/nightly/cpu/vllm-engine/", "/nightly/cpu/"):
        r, body = get(server, path, headers={"Accept": accept} if accept else {})
        assert r.status == 200 and r.getheader("Content-Type") == ctype
        assert r.getheader("Vary") == "Accept", "every negotiated answer says it varies"
        assert body.startswith(b"{") == (ctype == SIMPLE_JSON_CT)


def test_plain_files_do_not_vary(served):
    r, _ = get(served[0], "/nightly/cpu/vllm-engine/index.html")
    assert r.status == 200 and r.getheader("Vary") is None


@pytest.mark.parametrize("path", ["/nightly/cpu/vllm_engine/", "/nightly/cpu/VLLM.Engine/",
                                  "/nightly/cpu/vllm_engine"])
def test_non_normalized_project_names_redirect(served, path):
    r, _ = get(served[0], path)
    assert r.status == 301 and r.getheader("Location").startswith("/nightly/cpu/vllm-engine")
    assert get(served[0], "/nightly/cpu/nothing_here/")[0].status == 404


def test_thread_pool_is_capped_and_serves_a_crowd(tmp_path):
    (tmp_path / "f.txt").write_text("x" * 1000)
    def pool_threads() -> int:
        return sum(t.name.startswith("index-serve-") for t in threading.enumerate())

    before = pool_threads()
    server = make_server(tmp_path, threads=3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda _: get(server, "/f.txt"), range(96)))
        assert all(r.status == 200 and len(b) == 1000 for r, b in answers)
        # at most 3 workers, however many clients came (threads of servers from
        # earlier tests may still be ending, so the count can only be bounded)
        assert pool_threads() - before <= 3
    finally:
        server.shutdown()
        server.server_close()


def _serve(idx, *extra, python_flags=()) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, *python_flags, "-m", "wheel_index", "serve",
                             "--index", str(idx),
                             "--port", str(port), *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert "serving" in proc.stdout.readline()
    return proc, port


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_streams_large_files_in_flat_memory(served):
    """A 256 MiB file (sparse: no disk used) downloaded four times at once:
    a server that read files into memory would peak above 256 MiB."""
    _, idx, _ = served
    big = idx / "big.bin"
    with open(big, "wb") as f:
        f.truncate(256 << 20)
    proc, port = _serve(idx)
    try:
        def download(_):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", "/big.bin")
            r = conn.getresponse()
            n = 0
            while chunk := r.read(1 << 20):
                n += len(chunk)
            conn.close()
            return n

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(download, range(4))) == [256 << 20] * 4
        peak = _peak_rss_kib(proc.pid)
        assert peak < 120 * 1024, f"server peaked at {peak >> 10} MiB serving a 256 MiB file"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_ctrl_c_stops_cleanly_with_a_connection_open(served):
    _, idx, _ = served
    proc, port = _serve(idx, python_flags=("-X", "faulthandler"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/nightly/cpu/")  # keep-alive: a worker now waits on this connection
    conn.getresponse().read()
    proc.send_signal(signal.SIGINT)
    try:
        # what this checks is a clean exit; 10 s ran out once beside a compile on 2 cores
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"no exit 30 s after Ctrl-C; the server's threads:\n{err[-6000:]}")
    finally:
        conn.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "stopped" in out


def test_serve_refuses_a_path_that_is_not_an_index(tmp_path):
    for given in (tmp_path / "missing", REPO / "README.md", REPO / "ci"):
        proc = subprocess.run([sys.executable, "-m", "wheel_index", "serve", "--index",
                               str(given), "--port", str(free_port())], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"error: --index {given}")

