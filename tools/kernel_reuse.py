"""Kernel reuse: a commit that changes no compiled input gets its wheel from an
earlier wheel's kernels instead of a compile.

find:   ci/build-wheel.sh asks for a wheel of this variant in the index named by
        VLLM_WHEEL_INDEX whose kernel fingerprint equals this checkout's
        (tools/fingerprint.py); it then builds through precompiled mode.
check:  wheel_index publish accepts a wheel built from commit X under commit Y
        only when X's kernels were compiled from Y's compiled inputs.

    python -m tools.kernel_reuse find --variant cpu [--index URL|DIR]
prints the wheel's location (with #sha256=) when one is found, else nothing.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

from tools import fingerprint, gitutil
from tools.errors import UserError

BUILD_INFO = "engine/_build_info.json"
#: How far back main's first-parent history is searched for a reusable wheel.
SEARCH_DEPTH = 20


def read_build_info(wheel: Path) -> dict:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return json.loads(zf.read(BUILD_INFO))
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise UserError(f"{wheel}: cannot read {BUILD_INFO} ({exc})") from None


def check_publishable(wheel: Path, built_from: str, commit: str, root: Path) -> str:
    """Why the kernels of a wheel built from another commit may be published
    under commit (a log line), or a UserError saying why not."""
    name = wheel.name
    sources = read_build_info(wheel).get("kernel_sources")
    if not sources:
        raise UserError(f"{name} was built from commit {built_from}, not {commit}, and records "
                        "no kernel fingerprint to show its kernels are this commit's; rebuild it "
                        f"from {commit}")
    if gitutil.rev(root, commit) is None:
        raise UserError(f"{name} was built from commit {built_from}, not {commit}; {commit} is "
                        f"not in the git repository at {root}, so its compiled inputs cannot be "
                        "compared: publish from a clone that has it")
    theirs = fingerprint.sources_of_commit(root, commit)
    if theirs != sources:
        raise UserError(f"{name} was built from commit {built_from}, whose compiled inputs "
                        f"differ from {commit}'s (kernel sources {sources[:12]} vs "
                        f"{theirs[:12]}); build it from {commit}")
    return (f"{name}: kernels built from {built_from[:12]}, whose compiled inputs are "
            f"identical to {commit[:12]}'s (kernel sources {sources[:12]})")


def _candidates(root: Path, index: str, variant: str, local_sources: str):
    """(level, commit) pairs to try, newest first: main's first-parent history
    from HEAD whose compiled inputs match this checkout, then nightly."""
    from tools.precompiled.select import read_level_metadata

    seen = set()
    if gitutil.is_repo(root):
        for older in gitutil.first_parents(root, "HEAD", SEARCH_DEPTH + 1):
            if fingerprint.sources_of_commit(root, older) != local_sources:
                break  # older commits lie behind a compiled-input change
            meta = read_level_metadata(index, f"{older}/{variant}")
            if meta is not None:
                seen.add(older)
                yield f"{older}/{variant}", meta
    meta = read_level_metadata(index, f"nightly/{variant}")
    if meta is not None and meta.get("commit") not in seen:
        yield f"nightly/{variant}", meta


def find(root: Path, index: str, variant: str, env: Mapping[str, str], log=print) -> str | None:
    """The location (URL or path, with #sha256=) of a wheel of this variant in
    the index whose kernel fingerprint equals this checkout's build, or None."""
    from tools.precompiled.fetch import fetch
    from tools.precompiled.select import pick_wheel
    from tools.variants import get_variant

    v = get_variant(variant)
    want = fingerprint.of_build(root, v.label, v.device, env)
    index = index.rstrip("/")
    for level, meta in _candidates(root, index, v.label, want["kernel_sources"]):
        picked = pick_wheel(meta, v.label, index, level)
        if picked is None:
            continue
        entry, url = picked
        path = fetch(url, entry.get("sha256"), env, log=log)
        have = read_build_info(path).get("kernel_fingerprint")
        if have == want["kernel_fingerprint"]:
            log(f"kernel reuse: {level} has {entry['filename']} with this build's kernel "
                f"fingerprint {have[:12]} ({platform.machine()})")
            return f"{url}#sha256={entry['sha256']}" if entry.get("sha256") else url
        log(f"kernel reuse: {level}: {entry['filename']} has kernel fingerprint "
            f"{(have or 'none')[:12]}, this build needs {want['kernel_fingerprint'][:12]}")
    return None


def _main(argv: list[str] | None = None) -> int:
    import argparse

    from tools.build_settings import wheel_index
    from tools.requirements import REPO_ROOT

    ap = argparse.ArgumentParser(prog="python -m tools.kernel_reuse")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("find", help="print a reusable wheel's location, or nothing")
    f.add_argument("--variant", required=True)
    f.add_argument("--index", default=wheel_index(),
                   help="wheel index (folder, file:// or http(s)://); default $VLLM_WHEEL_INDEX")
    args = ap.parse_args(argv)
    if not args.index:
        return 0
    if args.index.startswith("s3://"):
        print("kernel reuse: an s3:// index cannot be read here; give its http(s) URL",
              file=sys.stderr)
        return 0
    try:
        found = find(REPO_ROOT, args.index, args.variant, os.environ,
                     log=lambda m: print(m, file=sys.stderr))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if found:
        print(found)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
