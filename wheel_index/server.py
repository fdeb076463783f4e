"""`serve`: a folder index over HTTP, as a CDN would serve object storage.

Serves only files inside its root (no '..', encoded or not, and no symlink
that leaves the root), answers a folder with its index.html, or index.json
when the client asks for PEP 691 JSON, sends cache headers (immutable wheels,
short-lived nightly pages), and answers bad requests with 4xx.
"""
from __future__ import annotations

import email.utils
import http.server
import os
import posixpath
from pathlib import Path
from urllib.parse import unquote, urlsplit

from wheel_index.layout import SIMPLE_JSON_CT, cache_control, content_type


def wants_json(accept: str) -> bool:
    """PEP 691 negotiation: JSON when the client ranks it above HTML."""
    best_json, best_html = 0.0, 0.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if fields[0] == SIMPLE_JSON_CT:
            best_json = max(best_json, q)
        elif fields[0] in ("application/vnd.pypi.simple.v1+html", "text/html"):
            best_html = max(best_html, q)
    return best_json > best_html


class IndexHandler(http.server.BaseHTTPRequestHandler):
    root: Path
    server_version = "vllm-engine-index"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet by default; requests are not secrets but noise
        if os.environ.get("VLLM_INDEX_LOG"):
            super().log_message(fmt, *args)

    def _error(self, code: int, message: str) -> None:
        body = f"{code} {message}\n".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _resolve(self) -> tuple[Path, str] | None:
        path = unquote(urlsplit(self.path).path)
        if "\x00" in path or "\\" in path:
            return None
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            return None
        key = "/".join(parts)
        target = (self.root / key) if key else self.root
        try:
            real = target.resolve(strict=True)
        except (OSError, RuntimeError):
            return target, key  # does not exist: 404 later
        root = self.root.resolve()
        if real != root and root not in real.parents:
            return None
        return real, key

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        resolved = self._resolve()
        if resolved is None:
            return self._error(400, "Bad Request: path leaves the index")
        target, key = resolved
        ctype = None
        if target.is_dir():
            if not urlsplit(self.path).path.endswith("/"):
                self.send_response(301)
                self.send_header("Location", urlsplit(self.path).path + "/")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if wants_json(self.headers.get("Accept", "")) and (target / "index.json").is_file():
                target, ctype = target / "index.json", SIMPLE_JSON_CT
            else:
                target = target / "index.html"
            key = posixpath.join(key, target.name) if key else target.name
        if not target.is_file():
            return self._error(404, "Not Found")
        try:
            data = target.read_bytes()
        except OSError:
            return self._error(404, "Not Found")
        self.send_response(200)
        self.send_header("Content-Type", ctype or content_type(key))
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", cache_control(key))
        self.send_header("Last-Modified", email.utils.formatdate(target.stat().st_mtime,
                                                                 usegmt=True))
        if ctype:
            self.send_header("Vary", "Accept")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_allowed(self):
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed


def make_server(root: Path, host: str = "127.0.0.1", port: int = 0):
    handler = type("Handler", (IndexHandler,), {"root": Path(root).absolute()})
    return http.server.ThreadingHTTPServer((host, port), handler)
