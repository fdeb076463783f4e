"""python -m wheel_index publish | serve | prune | verify | ls"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from tools.errors import UserError
from wheel_index import envs
from wheel_index.maintain import pointers, prune, published, verify
from wheel_index.publish import publish
from wheel_index.server import DEFAULT_THREADS
from wheel_index.storage import LocalStorage, open_index


def _index_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", required=True,
                        help="a folder, file://folder or s3://bucket/prefix")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wheel_index", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pub = sub.add_parser("publish", help="store wheels under a commit and write its pages")
    _index_argument(pub)
    pub.add_argument("--commit", required=True, help="the full 40-hex commit the wheels are of")
    pub.add_argument("--commit-time", help="commit time (epoch or ISO 8601); default: from git")
    pub.add_argument("--nightly", action="store_true", help="also move nightly to this commit")
    pub.add_argument("--release", action="store_true", help="also write the <version>/ pages")
    pub.add_argument("--force", action="store_true", help="replace a wheel with different bytes")
    pub.add_argument("--allow-rewind", action="store_true", help="let nightly move backwards")
    pub.add_argument("wheels", nargs="+", type=Path)

    srv = sub.add_parser("serve", help="serve a folder index over HTTP")
    srv.add_argument("--index", required=True)
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                     help=f"connections served at once (default {DEFAULT_THREADS}); more wait")

    pr = sub.add_parser("prune", help="remove old commits (never nightly's or a release's)")
    _index_argument(pr)
    g = pr.add_mutually_exclusive_group(required=True)
    g.add_argument("--keep-days", type=int)
    g.add_argument("--keep-commits", type=int)
    pr.add_argument("--dry-run", action="store_true")

    ve = sub.add_parser("verify", help="check every page against the stored files")
    _index_argument(ve)
    ve.add_argument("--full", action="store_true",
                    help="also read every wheel and check its sha256 (default: quick, sizes "
                         "from the listing)")

    ls = sub.add_parser("ls", help="what is published, newest first")
    _index_argument(ls)
    ls.add_argument("--commit")
    ls.add_argument("--variant")
    return p


def _serve_until_ctrl_c(server, ready: str) -> None:
    """serve_forever until SIGINT (Ctrl-C). The handler asks the loop to return
    (shutdown() from another thread: it waits for the loop) rather than letting
    KeyboardInterrupt land wherever the main thread is: once in a CI run the
    server never exited after a Ctrl-C with a keep-alive connection open."""
    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = signal.signal(signal.SIGINT, stop)
    print(ready, flush=True)  # a Ctrl-C from now on is heard
    try:
        server.serve_forever()
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args) -> int:
    if args.command == "serve":
        from wheel_index.server import make_server

        storage = open_index(args.index)
        if not isinstance(storage, LocalStorage):
            raise UserError(f"--index {args.index}: serve takes a folder; an S3 bucket is served "
                            "by its own HTTP endpoint or CDN")
        if args.threads < 1:
            raise UserError(f"--threads {args.threads}: give at least 1")
        try:
            server = make_server(storage.root, args.host, args.port, threads=args.threads)
        except OSError as exc:
            raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                            "choose another --port") from None
        try:
            _serve_until_ctrl_c(server, f"serving {storage.root} on "
                                        f"http://{args.host}:{server.server_address[1]}/")
            print("stopped", flush=True)
        finally:
            server.server_close()  # cut open connections, then exit 0
        return 0
    storage = open_index(args.index, create=args.command == "publish")
    if args.command == "publish":
        # the folder is made under the lock, once every wheel is accepted
        r = publish(storage, args.commit, args.wheels, nightly=args.nightly, release=args.release,
                    force=args.force, allow_rewind=args.allow_rewind,
                    commit_time=args.commit_time)
        for name in r.stored:
            print(f"stored    {name}")
        for name in r.unchanged:
            print(f"unchanged {name}")
        print(f"{len(r.pages_written)} page(s) written to {storage.describe()}")
        if r.variants and (r.variants.stored or r.variants.unchanged):
            print(f"variants level: {len(r.variants.stored)} variant wheel(s) stored, "
                  f"{len(r.variants.unchanged)} unchanged, {len(r.variants.pages_written)} "
                  "file(s) written")
        return 0
    if args.command == "prune":
        prune(storage, keep_days=args.keep_days, keep_commits=args.keep_commits,
              dry_run=args.dry_run)
        return 0
    if args.command == "verify":
        problems = verify(storage, full=args.full)
        mode = ("full: every wheel's sha256 checked" if args.full else
                "quick: wheel sizes and ETags from the listing; --full checks every sha256")
        print(f"{len(problems)} problem(s) in {storage.describe()} ({mode})")
        return 1 if problems else 0
    if args.command == "ls":
        marks: dict[str, list[str]] = {}
        for view, commit in pointers(storage).items():
            marks.setdefault(commit, []).append(view)
        for p in published(storage, args.commit, args.variant):
            when = datetime.fromtimestamp(p.commit_time, timezone.utc).strftime("%Y-%m-%d %H:%M")
            tag = f"  [{', '.join(sorted(marks[p.commit]))}]" if p.commit in marks else ""
            print(f"{p.commit}  {when}{tag}")
            for variant, files in sorted(p.variants.items()):
                for f in files:
                    print(f"    {variant:<8} {f}")
        return 0
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        if envs.debug():
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
