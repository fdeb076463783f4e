"""`wheel_index serve` under a crowd, against `python -m http.server` on the same folder.

    python benchmarks/serve_index.py [--size-mb 512] [--clients 32] [--check]

1. CLIENTS clients download a SIZE-MB wheel at once from the served index (its
   percent-encoded link); the server's peak RSS (VmHWM) is printed beside its
   RSS when idle, and every download's sha256 is checked. Target: peak < 150 MB,
   every hash right.
2. Page requests per second (the nightly project page, a new connection per
   request as http.server needs, 8 client threads), ours divided by
   `python -m http.server` serving the same folder, measured in alternating
   rounds. Target: >= 1x. Keep-alive requests per second are printed as well.

--check exits non-zero when a target is missed, naming it.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import hashlib
import http.client
import statistics
import subprocess
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urljoin

from benchmarks.common import add_record_argument, record, rss_mb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO / "tests"))

from helpers import free_port, make_wheel  # noqa: E402
from tools.hashing import sha256_file  # noqa: E402
from wheel_index.layout import href  # noqa: E402
from wheel_index.publish import publish  # noqa: E402
from wheel_index.storage import LocalStorage  # noqa: E402

COMMIT = "e" * 40
RSS_TARGET_MB = 150
PAGE = "/nightly/cpu/vllm-engine/"


def big_wheel(folder: Path, size_mb: int) -> Path:
    """A well-formed wheel carrying size_mb MiB of incompressible payload."""
    w = make_wheel(folder, "0.1.dev1+g1234567.cpu", commit=COMMIT)
    with zipfile.ZipFile(w, "a") as zf, zf.open(
            zipfile.ZipInfo("engine/_payload.bin", (2026, 1, 1, 0, 0, 0)), "w",
            force_zip64=True) as out:
        for _ in range(size_mb // 8):
            out.write(os.urandom(8 << 20))
    return w


def start(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    # output to a file: http.server logs every request, and a pipe nobody reads would
    # stall it once full
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("HEAD", "/")
            c.getresponse().read()
            c.close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"server did not start: {' '.join(cmd)}\n{log.read_text()[-2000:]}")


def download(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("GET", path)
    r = conn.getresponse()
    if r.status != 200:
        return f"HTTP {r.status}"
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while n := r.readinto(buf):
        h.update(view[:n])
    conn.close()
    return h.hexdigest()


def page_rate(port: int, seconds: float, keep_alive: bool, threads: int = 8) -> float:
    """Page requests per second from `threads` clients for about `seconds`."""
    deadline = time.perf_counter() + seconds

    def client(_):
        n, conn = 0, None
        while time.perf_counter() < deadline:
            if conn is None or not keep_alive:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", PAGE)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"page answered HTTP {r.status}")
            if not keep_alive or r.will_close:
                conn.close()
                conn = None
            n += 1
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(client, range(threads)))
    return total / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=512)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="alternating page-rate rounds")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    add_record_argument(p)
    args = p.parse_args()
    misses = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        t0 = time.perf_counter()
        w = big_wheel(tmp / "w", args.size_mb)
        idx = tmp / "index"
        publish(LocalStorage(idx), COMMIT, [w], nightly=True, commit_time="1",
                log=lambda m: None)
        want = sha256_file(w)
        # the link the nightly page gives, resolved as pip and uv resolve it
        path = urljoin(PAGE, href(f"{COMMIT}/cpu/vllm-engine/{w.name}", "nightly/cpu"))
        print(f"{w.stat().st_size >> 20} MiB wheel built and published in "
              f"{time.perf_counter() - t0:.0f} s")

        ours_port, base_port = free_port(), free_port()
        ours = start([sys.executable, "-m", "wheel_index", "serve", "--index", str(idx),
                      "--port", str(ours_port)], ours_port, tmp / "ours.log")
        base = start([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                      str(idx), str(base_port)], base_port, tmp / "base.log")
        try:
            idle = rss_mb(ours.pid, "VmRSS")
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                got = list(pool.map(lambda _: download(ours_port, path), range(args.clients)))
            took = time.perf_counter() - t0
            peak = rss_mb(ours.pid, "VmHWM")
            wrong = sum(g != want for g in got)
            print(f"{args.clients} clients x {args.size_mb} MiB: {took:.1f} s "
                  f"({args.clients * args.size_mb / took:.0f} MiB/s in all); server RSS idle "
                  f"{idle:.0f} MB, peak {peak:.0f} MB = {peak / idle:.2f}x idle (target peak < "
                  f"{RSS_TARGET_MB} MB) {'ok' if peak < RSS_TARGET_MB else 'MISS'}; "
                  f"sha256 wrong: {wrong} of {args.clients}")
            if peak >= RSS_TARGET_MB:
                misses.append(f"peak server RSS {peak:.0f} MB >= {RSS_TARGET_MB} MB")
            if wrong:
                misses.append(f"{wrong} download(s) with a wrong sha256 ({set(got) - {want}})")

            rates = {"ours": [], "http.server": []}
            for _ in range(args.rounds):
                rates["ours"].append(page_rate(ours_port, 2.0, keep_alive=False))
                rates["http.server"].append(page_rate(base_port, 2.0, keep_alive=False))
            r_ours, r_base = (statistics.median(rates[k]) for k in ("ours", "http.server"))
            ratio = r_ours / r_base
            keep = page_rate(ours_port, 2.0, keep_alive=True)
            print(f"page requests/s, a connection each: ours {r_ours:.0f}, http.server "
                  f"{r_base:.0f} = {ratio:.2f}x (target >= 1x) {'ok' if ratio >= 1 else 'MISS'}; "
                  f"ours with keep-alive {keep:.0f} = {keep / r_base:.2f}x")
            if ratio < 1:
                misses.append(f"page requests/s {ratio:.2f}x http.server (target >= 1x)")
        finally:
            for proc in (ours, base):
                proc.terminate()
                proc.wait(timeout=30)
    for m in misses:
        print(f"MISS: {m}")
    if args.record:
        record("serve_index", [
            (f"{args.clients} clients x {args.size_mb} MiB wheel: server peak RSS",
             f"{peak:.0f} MB ({peak / idle:.2f}x idle), sha256 wrong {wrong}/{args.clients}",
             f"< {RSS_TARGET_MB} MB {'met' if peak < RSS_TARGET_MB else 'missed'}"),
            ("page requests/s vs python -m http.server, a connection each",
             f"{ratio:.2f}x (keep-alive {keep / r_base:.2f}x)",
             f">= 1x {'met' if ratio >= 1 else 'missed'}")])
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
