"""`wheel_index serve` and Range (RFC 9110 14): one valid range is a 206 with its
Content-Range; an unsatisfiable one a 416 with `Content-Range: bytes */LEN`;
a malformed header, another unit, several ranges or two Range fields are
ignored (200, the whole file); HEAD ignores Range. Against the real server on
127.0.0.1, with requests as a client would send them."""
from __future__ import annotations

import http.client
import threading

import pytest
import requests

from wheel_index.server import byte_range, make_server

DATA = bytes(range(256)) * 40  # 10240 bytes, every offset recognisable
N = len(DATA)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    (root / "blob.bin").write_bytes(DATA)
    (root / "empty.bin").write_bytes(b"")
    server = make_server(root, threads=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://%s:%d" % server.server_address
    server.shutdown()
    server.server_close()


def _get(url, range_, path="/blob.bin", method="GET"):
    return requests.request(method, url + path, headers={"Range": range_}, timeout=10)


@pytest.mark.parametrize("range_,first,last", [
    ("bytes=0-0", 0, 0), ("bytes=100-199", 100, 199),
    ("bytes=10000-", 10000, N - 1),          # open
    ("bytes=-16", N - 16, N - 1),            # suffix: what pip asks first
    ("bytes=-999999", 0, N - 1),             # a suffix longer than the file: all of it
    ("bytes=0-999999", 0, N - 1),            # a last byte past the end: up to the end
    (f"bytes={N - 1}-", N - 1, N - 1),
    ("Bytes=5-9", 5, 9),                      # the unit is case-insensitive
    ("bytes=, 5-9 ,", 5, 9),                  # empty list elements are ignored
    ("bytes=0-" + "9" * 5000, 0, N - 1),      # past int()'s digit limit
])
def test_one_valid_range_is_206(url, range_, first, last):
    r = _get(url, range_)
    assert r.status_code == 206, r.text
    assert r.content == DATA[first:last + 1]
    assert r.headers["Content-Range"] == f"bytes {first}-{last}/{N}"
    assert r.headers["Content-Length"] == str(last - first + 1)


@pytest.mark.parametrize("range_", [
    f"bytes={N}-", f"bytes={N}-{N + 5}", "bytes=-0", "bytes=99999999999999999999-",
    "bytes=" + "9" * 5000 + "-"])
def test_an_unsatisfiable_range_is_416_naming_the_length(url, range_):
    r = _get(url, range_)
    assert r.status_code == 416
    assert r.headers["Content-Range"] == f"bytes */{N}"


@pytest.mark.parametrize("range_", [
    "bytes=0-1,5-6", "bytes=0-1, 0-1", f"bytes=0-1,{N}-",   # several ranges
    "bytes=5-2",                                         # last before first: invalid
    "bytes=", "bytes=-", "bytes=x-1", "bytes=1-x", "bytes=1-2-3", "bytes=5", "bytes=+1-2",
    "bytes=0 - 9", "bytes=\u00b2-", "bytes=0-\u00b2", "bytes 0-9", "items=0-1", "=0-1", "garbage"])
def test_malformed_or_several_ranges_get_the_whole_file(url, range_):
    r = _get(url, range_)
    assert r.status_code == 200, (range_, r.status_code)
    assert r.content == DATA and "Content-Range" not in r.headers
    assert r.headers["Accept-Ranges"] == "bytes"


def test_two_range_fields_are_ignored(url):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("GET", "/blob.bin")
    conn.putheader("Range", "bytes=0-9")
    conn.putheader("Range", "bytes=20-29")
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 200 and r.read() == DATA
    conn.close()


def test_head_ignores_range(url):
    r = _get(url, "bytes=0-9", method="HEAD")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["Content-Length"] == str(N) and r.headers["Accept-Ranges"] == "bytes"


def test_an_empty_file(url):
    r = _get(url, "bytes=-5", path="/empty.bin")  # satisfiable, but no Content-Range fits
    assert r.status_code == 200 and r.content == b""
    r = _get(url, "bytes=0-", path="/empty.bin")
    assert r.status_code == 416 and r.headers["Content-Range"] == "bytes */0"


def test_byte_range_parsing():
    assert byte_range("bytes=0-0", 10) == (0, 0)
    assert byte_range("bytes=-20", 10) == (0, 9)
    assert byte_range("bytes=3-", 10) == (3, 9)
    assert byte_range("bytes=5-2", 10) is None and byte_range("items=0-1", 10) is None
    assert byte_range("bytes=\u0661-", 10) is None  # a digit, but not RFC 9110's DIGIT
    assert byte_range("bytes=0-1,3-4", 10) is None and byte_range("bytes=-5", 0) is None
    for bad in ("bytes=10-", "bytes=-0", "bytes=20-30", "bytes=0-"):
        with pytest.raises(ValueError):
            byte_range(bad, 10 if bad != "bytes=0-" else 0)
