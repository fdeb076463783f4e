"""`serve`: a folder index over HTTP, as a CDN in front of object storage would.

Serves only files inside its root (no '..', encoded or not, and no symlink that
leaves the root). A folder answers with its index.html or, by PEP 691
negotiation, its index.json, always with `Vary: Accept`. Files are streamed
with sendfile, so memory stays flat in file size and in clients; HEAD reads no
body; a single byte range is served (206, or 416 when unsatisfiable; several or
malformed ones get the whole file, as RFC 9110 allows); ETag and
Last-Modified come with every file and If-None-Match / If-Modified-Since get
304. A project name that is not normalized redirects to the normalized one
(PEP 503). A fixed pool of threads serves requests whose heads have all
arrived (wheel_index/connections.py): slow clients wait without a thread.
"""
from __future__ import annotations

import email.utils
import http.server
import io
import os
import re
import socketserver
import stat
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from packaging.utils import canonicalize_name

from wheel_index import envs
from wheel_index.connections import DEFAULT_THREADS, HEADER_TIMEOUT, IDLE_TIMEOUT, GatheringServer
from wheel_index.layout import HTML_CT, PROJECT, SIMPLE_JSON_CT, cache_control, content_type

#: files up to this size go out with their headers in one write; larger ones stream
SMALL = 64 << 10

V1_HTML = "application/vnd.pypi.simple.v1+html"
#: what a folder can be answered with, in the order a tie is decided, and the
#: media types (PEP 691's `latest` aliases included) each one satisfies
OFFERS = (
    (HTML_CT, ("text/html",)),
    (V1_HTML, (V1_HTML, "application/vnd.pypi.simple.latest+html")),
    (SIMPLE_JSON_CT, (SIMPLE_JSON_CT, "application/vnd.pypi.simple.latest+json")),
)


def negotiate(accept: str) -> str:
    """The Content-Type to answer a folder with: the offer the client ranks
    highest (the most specific matching range gives its q); text/html when
    nothing matches."""
    ranges = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        if not fields[0]:
            continue
        q = 1.0
        for f in fields[1:]:
            if f.lower().startswith("q="):
                try:
                    q = min(max(float(f[2:]), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        ranges.append((fields[0].lower(), q))
    best, best_q = HTML_CT, 0.0
    for ctype, names in OFFERS:
        major = names[0].split("/")[0]
        offer_q: float | None = None
        specificity = -1
        for media, mq in ranges:
            level = 2 if media in names else 1 if media == f"{major}/*" else \
                0 if media == "*/*" else -1
            if level > specificity:
                offer_q, specificity = mq, level
        if offer_q is not None and offer_q > best_q:
            best, best_q = ctype, offer_q
    return best


_POS = re.compile(r"[0-9]+", re.ASCII)  # RFC 9110's 1*DIGIT: ASCII only, no sign
#: past any file's size; a longer number is not parsed (int() refuses 4300+ digits)
_HUGE = 1 << 63


def _pos(text: str) -> int:
    return int(text) if len(text) <= 18 else _HUGE


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) byte of the one range a `Range: bytes=...` header asks
    for (RFC 9110 14.1.2): `N-M`, open `N-` or suffix `-N`. None to send the
    whole file: a malformed header, another unit, or several ranges (14.2 lets
    a server ignore Range; pip and uv ask one range at a time, and ignoring
    several spares the server their multipart and overlapping sets). Raises
    ValueError when the one range is unsatisfiable (416)."""
    unit, sep, spec = header.partition("=")
    if not sep or unit.lower() != "bytes":
        return None
    specs = [s.strip() for s in spec.split(",") if s.strip()]  # empty list items don't count
    if len(specs) != 1:
        return None
    first, sep, last = specs[0].partition("-")
    if not sep or not all(_POS.fullmatch(p) for p in (first, last) if p) or not (first or last):
        return None
    if not first:  # suffix-range: the last N bytes
        n = _pos(last)
        if n == 0:
            raise ValueError
        # an empty file satisfies it but no Content-Range can say so: all (nothing) of it
        return (max(size - n, 0), size - 1) if size else None
    start = _pos(first)
    if last and _pos(last) < start:
        return None  # an invalid int-range, not an unsatisfiable one
    if start >= size:
        raise ValueError
    return start, min(_pos(last) if last else size - 1, size - 1)


class IndexHandler(http.server.BaseHTTPRequestHandler):
    root: Path
    root_real: str  # the root with every symlink resolved, once
    # BaseHTTPRequestHandler.send_header's buffer (CPython; typeshed leaves it out):
    # a small page is appended to it so headers and body leave in one write
    _headers_buffer: list[bytes]
    server_version = "vllm-engine-index"
    protocol_version = "HTTP/1.1"

    def setup(self):
        """One request whose head has already arrived (a connections.Request):
        it is parsed from memory; only the answer touches the socket."""
        self.connection = self.request.sock
        self.rfile = io.BytesIO(self.request.head)
        self.wfile = socketserver._SocketWriter(self.connection)

    def handle(self):
        self.close_connection = True
        self.handle_one_request()  # the server hands a kept-alive connection back to wait

    def log_message(self, fmt, *args):  # quiet by default; requests are not secrets but noise
        if envs.log_requests():
            super().log_message(fmt, *args)

    def _error(self, code: int, message: str, headers: dict[str, str] | None = None) -> None:
        body = f"{code} {message}\n".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(301)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _resolve(self, url_path: str) -> tuple[str, str] | None:
        """(file system path, storage key); None when the path is not one the
        index can have ('..', NUL, a backslash, encoded or not).
        Plain os.path on strings: this runs on every request."""
        path = unquote(url_path)
        if "\x00" in path or "\\" in path:
            return None
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            return None
        if any(p.startswith(".") for p in parts):  # the publisher's lock, journal, temporaries
            return "", ""
        key = "/".join(parts)
        return (os.path.join(self.root_real, key) if key else self.root_real), key

    def _inside(self, path: str) -> str | None:
        """path with every symlink resolved, or None when that leaves the root:
        the one check every path opened goes through, after all its joins."""
        real = os.path.realpath(path)
        if real == self.root_real or real.startswith(self.root_real + os.sep):
            return real
        return None

    def do_GET(self):
        self._answer(body=True)

    def do_HEAD(self):
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        url = urlsplit(self.path)
        resolved = self._resolve(url.path)
        if resolved is None:
            return self._error(400, "Bad Request: path leaves the index")
        target, key = resolved
        if not target:
            return self._error(404, "Not Found")
        ctype = None
        folder = self._inside(target)
        if folder is not None and os.path.isdir(folder):
            if not url.path.endswith("/"):
                return self._redirect(url.path + "/")
            ctype = negotiate(self.headers.get("Accept", ""))
            name = "index.json" if ctype == SIMPLE_JSON_CT else "index.html"
            if name == "index.json" and not os.path.isfile(os.path.join(folder, name)):
                ctype, name = HTML_CT, "index.html"
            target = os.path.join(folder, name)
            key = f"{key}/{name}" if key else name
        elif not os.path.lexists(target):
            normalized = _normalized(url.path)
            if normalized:
                return self._redirect(normalized)
        real = self._inside(target)  # the file itself, which may be a link out of the root
        if real is None:
            return self._error(404, "Not Found")
        try:
            # the resolved path has no links left; O_NOFOLLOW refuses one swapped in since
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return self._error(404, "Not Found")
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return self._error(404, "Not Found")
            self._send_file(f if body else None, st, ctype or content_type(key), key,
                            negotiated=ctype is not None)

    def _send_file(self, f, st, ctype: str, key: str, negotiated: bool) -> None:
        etag = f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        common = {"ETag": etag, "Last-Modified": modified, "Cache-Control": cache_control(key)}
        if negotiated:
            common["Vary"] = "Accept"
        if self._not_modified(etag, st.st_mtime):
            self.send_response(304)
            for k, v in common.items():
                self.send_header(k, v)
            self.end_headers()
            return
        size, span = st.st_size, None
        if_range = self.headers.get("If-Range")
        ranges = self.headers.get_all("Range") or []
        # Range is defined for GET alone (RFC 9110 14.2: HEAD answers as a whole GET),
        # and is one field: two of them are as malformed as a bad one, so ignored
        if self.command == "GET" and len(ranges) == 1 and \
                (if_range is None or if_range in (etag, modified)):
            try:
                span = byte_range(ranges[0].strip(), size)
            except ValueError:
                return self._error(416, "Range Not Satisfiable",
                                   {"Content-Range": f"bytes */{size}", **common})
        start, length = (span[0], span[1] - span[0] + 1) if span else (0, size)
        self.send_response(206 if span else 200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if span:
            self.send_header("Content-Range", f"bytes {span[0]}-{span[1]}/{size}")
        for k, v in common.items():
            self.send_header(k, v)
        if f is not None and 0 < length <= SMALL:
            # a page: headers and body in one write, one system call
            self._headers_buffer.append(b"\r\n" + os.pread(f.fileno(), length, start))
            self.flush_headers()
            return
        self.end_headers()
        if f is None or length == 0:
            return
        # straight from the page cache to the socket, by the server's sender thread
        # (wheel_index/sender.py): this worker is free for the next request now
        self.body = (os.dup(f.fileno()), start, length)

    def _not_modified(self, etag: str, mtime: float) -> bool:
        inm = self.headers.get("If-None-Match")
        if inm is not None:
            tags = [t.strip().removeprefix("W/") for t in inm.split(",")]
            return "*" in tags or etag in tags
        ims = self.headers.get("If-Modified-Since")
        if ims:
            try:
                since = email.utils.parsedate_to_datetime(ims).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                return False
            return int(mtime) <= since
        return False

    def _not_allowed(self):
        self.close_connection = True  # its body, if any, is never read
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


def _normalized(url_path: str) -> str | None:
    """The same URL with the project's name normalized (PEP 503), when a
    segment names the project in another spelling (vllm_engine, VLLM.Engine)."""
    parts = url_path.split("/")
    fixed = [PROJECT if p and p != PROJECT and canonicalize_name(unquote(p)) == PROJECT else p
             for p in parts]
    return quote("/".join(fixed), safe="/%") if fixed != parts else None


def make_server(root: Path, host: str = "127.0.0.1", port: int = 0,
                threads: int = DEFAULT_THREADS, header_timeout: float = HEADER_TIMEOUT,
                idle_timeout: float = IDLE_TIMEOUT) -> GatheringServer:
    handler = type("Handler", (IndexHandler,), {"root": Path(root).absolute(),
                                                "root_real": os.path.realpath(root)})
    return GatheringServer((host, port), handler, threads, header_timeout, idle_timeout)
