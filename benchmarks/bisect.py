"""Bisect costs: one step against compiling that commit, and steps per range.

    python benchmarks/bisect.py [--check]

1. A bisect step with a warm cache: a fresh virtual environment, the commit's
   real cpu wheel (and the torch it pins) installed with uv, a trivial command
   run in it. Target: under 10 s. Shown beside the time of compiling the same
   commit from source (cold build, no compiler cache). Times are medians of 3.
2. Steps needed over a 64-commit range with synthetic wheels, for every
   position of the first bad commit. Target: at most 7.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO / "tests"))

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from helpers import torch_wheelhouse  # noqa: E402
from tools import bisect as tb  # noqa: E402
from wheel_index.publish import publish  # noqa: E402
from wheel_index.storage import open_storage  # noqa: E402


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


def step_time(tmp: Path, targets: Targets) -> None:
    src = tmp / "src"
    git(tmp, "clone", "-q", str(REPO), str(src))
    env = {**os.environ, "PYTHON": sys.executable, "VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse()),
           "UV": shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"}
    out = tmp / "wheels"
    subprocess.run(["bash", str(src / "ci/build-wheel.sh"), "cpu", str(out)], env=env, check=True,
                   capture_output=True)
    (wheel,) = out.glob("*.whl")
    commit = json.loads(zipfile.ZipFile(wheel).read("engine/_build_info.json"))["git_commit"]
    idx = tmp / "index"
    publish(open_storage(str(idx)), commit, [wheel], commit_time="1", log=lambda m: None)
    os.environ["VLLM_TORCH_FIND_LINKS"] = str(torch_wheelhouse())
    os.environ["VLLM_PRECOMPILED_CACHE"] = str(tmp / "cache")
    trivial = ["python", "-c", "import engine"]

    def one_step(i: int) -> float:
        t0 = time.perf_counter()
        work = tmp / f"step{i}"
        work.mkdir()
        inst = tb.Installer(work, str(idx), "cpu", log=lambda m: None)
        step = tb.test_commit(inst, commit, trivial)
        assert step.verdict == tb.GOOD, step
        return time.perf_counter() - t0

    one_step(0)  # warms uv's and the download cache
    steps = [one_step(i) for i in range(1, 4)]
    # Compiling the same commit: a cold build tree, no compiler cache on PATH.
    t0 = time.perf_counter()
    subprocess.run([env["UV"], "build", "-q", "--wheel", "--no-build-isolation", "--python",
                    sys.executable, "--out-dir", str(tmp / "built"), "."], cwd=src, check=True,
                   env={**os.environ, "VLLM_TARGET_DEVICE": "cpu",
                        "PATH": "/usr/local/bin:/usr/bin:/bin"}, capture_output=True)
    compile_time = time.perf_counter() - t0
    s = statistics.median(steps)
    print(f"bisect step, warm cache (fresh venv + wheel + torch, run `import engine`): "
          f"{s:5.2f} s")
    print(f"compiling that commit from source (cpu, cold, no compiler cache):          "
          f"{compile_time:5.2f} s  -> a step costs {s / compile_time:.2f}x a compile")
    targets.record("bisect step, warm cache", s, 10.0, higher_is_better=False, unit="s")


def steps_per_range(tmp: Path, targets: Targets, n: int = 64) -> None:
    repo = tmp / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "b@example.com")
    git(repo, "config", "user.name", "b")
    commits = []
    for i in range(n + 1):
        (repo / "f").write_text(str(i))
        git(repo, "add", "f")
        git(repo, "commit", "-qm", f"c{i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    worst = 0
    for breaks_at in range(1, n + 1):  # the commit (after the good one) that breaks
        idx = tmp / f"index{breaks_at}"
        tested = []

        def fake(inst, commit, command, breaks_at=breaks_at):
            tested.append(commit)
            bad = commits.index(commit) >= breaks_at
            return tb.Step(commit, tb.BAD if bad else tb.GOOD)

        real, tb.test_commit = tb.test_commit, fake
        try:
            idx.mkdir()
            r = tb.bisect(repo, commits[0], commits[-1], ["true"], str(idx), "cpu",
                          log=lambda m: None)
        finally:
            tb.test_commit = real
        assert r.first_bad == commits[breaks_at], breaks_at
        worst = max(worst, len(tested))
    print(f"{n}-commit range, every position of the first bad commit: at most {worst} steps")
    targets.record(f"steps over a {n}-commit range", worst, 7, higher_is_better=False, unit="")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_check_argument(p)
    args = p.parse_args()
    targets = Targets()
    with tempfile.TemporaryDirectory() as t:
        step_time(Path(t), targets)
        steps_per_range(Path(t), targets)
    return targets.finish(args.check, record_as="bisect" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
