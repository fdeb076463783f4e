"""The kernel fingerprint: one hash of everything that decides the compiled files.

Two commits whose fingerprints agree compile to the same kernels, so CI builds a
Python-only commit's wheel from an earlier wheel's kernels (precompiled mode)
instead of compiling, and the index accepts that wheel under the new commit.

fingerprint = sha256 of
  sources   the bytes of every file under COMPILED_INPUTS (csrc/, CMakeLists.txt,
            cmake/, requirements/build/, requirements/torch/: build requirements
            and the torch pin), by path;
  variant   cpu, cu130, ...;
  arch      the machine the kernels are compiled for;
  flags     the build variables the CMake code reads (FLAG_VARS).
The build info records the fingerprint and its sources part: the sources of
another commit can be checked from git alone, while variant, arch and flags
are facts of the wheel's own build.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from tools import gitutil
from tools.errors import UserError

#: Build variables that change the compiled files, per device ("*": every device).
FLAG_VARS = {
    "*": ("CMAKE_ARGS",),
    "cpu": ("VLLM_CPU_DISABLE_AVX512",),
    "cuda": ("TORCH_CUDA_ARCH_LIST",),
}


def _digest(files: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return h.hexdigest()


def _under_inputs(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in gitutil.COMPILED_INPUTS)


def sources_of_tree(root: Path) -> str:
    """The sources digest of a source tree as it is on disk (a checkout, with
    uncommitted changes and untracked files, or an unpacked sdist)."""
    if gitutil.is_repo(root):
        listed = gitutil.git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", *gitutil.COMPILED_INPUTS) or ""
        paths = [p for p in listed.split("\0") if p and (root / p).is_file()]
    else:
        paths = []
        for top in gitutil.COMPILED_INPUTS:
            base = root / top
            if base.is_file():
                paths.append(top)
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                paths += [Path(dirpath, f).relative_to(root).as_posix() for f in filenames]
    return _digest((p, (root / p).read_bytes()) for p in set(paths))


def sources_of_commit(root: Path, commit: str) -> str:
    """The sources digest of a commit, from git alone."""
    try:
        tar = subprocess.run(["git", "archive", "--format=tar", commit, "--",
                              *gitutil.COMPILED_INPUTS], cwd=root, capture_output=True,
                             timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"cannot read the compiled inputs of commit {commit} from git in "
                        f"{root}: {exc}; run this in a clone that has that commit") from None
    files = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        for m in tf.getmembers():
            data = tf.extractfile(m) if m.isfile() and _under_inputs(m.name) else None
            if data is not None:  # None only for links and folders, which isfile() left out
                files.append((m.name, data.read()))
    return _digest(files)


def flags(device: str, env: Mapping[str, str]) -> dict[str, str]:
    names = FLAG_VARS["*"] + FLAG_VARS.get(device, ())
    return {n: env.get(n, "").strip() for n in sorted(names)}


def fingerprint(sources: str, variant: str, arch: str, build_flags: Mapping[str, str]) -> str:
    blob = json.dumps({"sources": sources, "variant": variant, "arch": arch,
                       "flags": dict(build_flags)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def of_build(root: Path, variant: str, device: str, env: Mapping[str, str],
             arch: str | None = None) -> dict[str, str]:
    """What the build info records for a build of root: kernel_fingerprint and
    kernel_sources."""
    sources = sources_of_tree(root)
    return {"kernel_fingerprint": fingerprint(sources, variant, arch or platform.machine(),
                                              flags(device, env)),
            "kernel_sources": sources}


def _main(argv: list[str] | None = None) -> int:
    import argparse

    from tools.requirements import REPO_ROOT
    from tools.variants import get_variant

    ap = argparse.ArgumentParser(prog="python -m tools.fingerprint",
                                 description="Print the kernel fingerprint of this checkout.")
    ap.add_argument("--variant", required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        v = get_variant(args.variant)
        out = of_build(REPO_ROOT, v.label, v.device, os.environ)
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(json.dumps(out) if args.json else out["kernel_fingerprint"])
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
