"""Wheel index costs, each against its baseline in the same run.

    python benchmarks/index.py [--commits 1000] [--skip-s3] [--check]

1. Publishing one commit into an index that already holds N commits, divided
   by publishing one into an empty index, on disk and on S3 (moto on
   loopback). Target: <= 1.5x.
2. Bytes a `uv pip install --dry-run` transfers from the served nightly page,
   against the size of the wheel. Target: < 1/10 (uv reads the .metadata file).
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO / "tests"))

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from helpers import MotoServer, make_wheel  # noqa: E402
from wheel_index.publish import publish  # noqa: E402
from wheel_index.server import IndexHandler, make_server  # noqa: E402
from wheel_index.storage import open_storage  # noqa: E402


def commit_of(i: int) -> str:
    return f"{i:040x}"


def publish_time(storage, wheel_dir: Path, start: int, repeat: int = 5) -> float:
    times = []
    for r in range(repeat):
        c = commit_of(start + r)
        w = make_wheel(wheel_dir / c, "0.1.dev1+g1234567.cpu", commit=c)
        t0 = time.perf_counter()
        publish(storage, c, [w], nightly=True, commit_time=str(start + r), log=lambda m: None)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fill(storage, wheel_dir: Path, n: int) -> None:
    def one(i):
        c = commit_of(i)
        w = make_wheel(wheel_dir / c, "0.1.dev1+g1234567.cpu", commit=c)
        publish(storage, c, [w], commit_time=str(i), log=lambda m: None)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(1, n + 1)))


def bench_publish(make_storage, label: str, n: int, tmp: Path, targets: Targets) -> None:
    empty = make_storage("empty")
    full = make_storage("full")
    t0 = time.perf_counter()
    fill(full, tmp / f"{label}-fill", n)
    filled = time.perf_counter() - t0
    t_empty = publish_time(empty, tmp / f"{label}-e", 10_000_000)
    t_full = publish_time(full, tmp / f"{label}-f", 20_000_000)
    ratio = t_full / t_empty
    print(f"publish one commit, {label:<5}: empty index {t_empty * 1e3:7.1f} ms, "
          f"{n} commits {t_full * 1e3:7.1f} ms, ratio {ratio:4.2f}x   [filled in {filled:.0f} s]")
    targets.record(f"publish into {n} commits vs empty ({label})", ratio, 1.5,
                   higher_is_better=False)


class Counting(IndexHandler):
    sent: dict[str, int] = {}
    lock = threading.Lock()

    def send_header(self, keyword, value):
        if keyword == "Content-Length" and self.command == "GET":
            with self.lock:
                self.sent[self.path] = self.sent.get(self.path, 0) + int(value)
        super().send_header(keyword, value)


def bench_dry_run(tmp: Path, targets: Targets) -> None:
    idx = tmp / "dry-index"
    c = commit_of(1)
    # A wheel of realistic size: 8 MiB of incompressible kernel-like payload.
    body = "BLOB = " + repr(os.urandom(8 << 20).hex()) + "\n"
    w = make_wheel(tmp / "big", "0.1.dev1+g1234567.cpu", commit=c, body=body)
    publish(open_storage(str(idx)), c, [w], nightly=True, commit_time="1", log=lambda m: None)
    server = make_server(idx)
    server.RequestHandlerClass = type("H", (Counting,), {"root": idx.absolute(),
                                                         "root_real": os.path.realpath(idx)})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/nightly/cpu"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    venv = tmp / "venv"
    subprocess.run([uv, "venv", "-q", str(venv)], check=True)
    env = {**os.environ, "UV_CACHE_DIR": str(tmp / "uv-cache")}  # cold: nothing cached
    res = subprocess.run([uv, "pip", "install", "--dry-run", "--python", str(venv / "bin/python"),
                          "vllm-engine", "--index-url", url], env=env, capture_output=True,
                         text=True)
    server.shutdown()
    if res.returncode != 0:
        sys.exit(res.stderr)
    total = sum(Counting.sent.values())
    size = w.stat().st_size
    print(f"uv pip install --dry-run from nightly/cpu: {total} bytes transferred for a "
          f"{size} byte wheel = {total / size:.4f} of it")
    targets.record("uv --dry-run bytes / wheel size", total / size, 0.1, higher_is_better=False,
                   unit="")
    for path, n in sorted(Counting.sent.items()):
        print(f"    {n:9d}  {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=1000)
    p.add_argument("--skip-s3", action="store_true")
    add_check_argument(p)
    args = p.parse_args()
    targets = Targets()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        bench_publish(lambda name: open_storage(str(tmp / f"disk-{name}")), "disk",
                      args.commits, tmp, targets)
        if not args.skip_s3:
            import boto3

            moto = MotoServer()
            try:
                os.environ.update(moto.env())
                s3 = boto3.client("s3")

                def make_s3(name):
                    s3.create_bucket(Bucket=f"bench-{name}")
                    return open_storage(f"s3://bench-{name}/wheels")

                bench_publish(make_s3, "s3", args.commits, tmp, targets)
            finally:
                moto.close()
        bench_dry_run(tmp, targets)
    return targets.finish(args.check, record_as="index" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
