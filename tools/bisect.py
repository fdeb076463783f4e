"""Find the commit that broke something by installing per-commit wheels
instead of compiling: `python -m tools.bisect`.

    python -m tools.bisect --good REV --bad REV [--variant V] [--index URL] [--json] -- CMD...
    python -m tools.bisect run-one REV [--variant V] [--index URL] -- CMD...

Walks main's first-parent history between the two revisions. Each candidate's
wheel is installed with uv into a virtual environment of the bisect's own
(with uv's cache, and the torch the wheel pins) and CMD runs there: exit 0 is
good, 125 is skip, anything else is bad (git bisect run's convention).
Commits without a wheel for the variant are skipped. The two ends are tested
first: CMD must pass at --good and fail at --bad (an end without a wheel gives
way to the nearest testable commit inside the range), else there is nothing
to bisect and it says so. A wheel that does not install is an error, not a
skip: that is mostly the environment (torch's index, the network), and a skip
would turn it into an ambiguous answer. The user's checkout and active
environment are never touched: CMD runs in a scratch folder (so that the
checkout's engine/ cannot shadow the installed wheel) without PYTHONPATH;
give it absolute paths to anything it needs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tools import build_settings, gitutil
from tools.errors import UserError
from tools.precompiled.fetch import fetch, get_bytes
from tools.precompiled.select import index_url, pick_wheel
from tools.target import detect
from tools.variants import get_variant
from wheel_index.documents import parse_metadata_json
from wheel_index.layout import VARIANTS_LEVEL
from wheel_index.variant_wheels import UV_PREVIEW, is_variant_wheel

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass
class Step:
    commit: str
    verdict: str
    reason: str = ""


@dataclass
class Result:
    first_bad: str | None
    candidates: list[str]  # when skips hide the answer: the range holding the first bad commit
    steps: list[Step] = field(default_factory=list)


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if not found:
        raise UserError("uv is needed to install the wheels (pip install uv)")
    return found


def torch_source_args(variant: str) -> list[str]:
    """Where the wheel's torch comes from: VLLM_TORCH_FIND_LINKS (a folder), or
    the variant's torch index under VLLM_TORCH_INDEX_BASE; PyPI for plain pins."""
    links = build_settings.torch_find_links()
    if links:
        return ["--find-links", links]
    v = get_variant(variant)
    url = v.torch_index_url()
    return ["--extra-index-url", url] if url else []


class Installer:
    """One virtual environment for the whole bisect, outside the user's."""

    def __init__(self, workdir: Path, index: str, variant: str, log):
        self.index, self.variant, self.log = index, variant, log
        self.venv = workdir / "venv"
        # Commands run here, not in the checkout, whose engine/ would shadow the wheel's.
        self.scratch = workdir / "run"
        self.scratch.mkdir()
        self.uv = _uv()
        subprocess.run([self.uv, "venv", "-q", "--python", sys.executable, str(self.venv)],
                       check=True)

    def wheel(self, commit: str) -> tuple[str, str] | None:
        """(URL, sha256) of the commit's wheel for this variant and machine."""
        # The per-variant level first, else the commit's variants level (variant wheels).
        for level in (f"{commit}/{self.variant}", f"{commit}/{VARIANTS_LEVEL}"):
            data = get_bytes(f"{self.index}/{level}/metadata.json")
            if data is None:
                continue
            meta = parse_metadata_json(data, f"{self.index}/{level}/metadata.json")
            picked = pick_wheel(meta, self.variant, self.index, level)
            if picked:
                w, url = picked
                return url, w["sha256"]
        return None

    def install(self, url: str, sha256: str) -> subprocess.CompletedProcess:
        # Downloaded once into the hash-keyed cache and checked before use.
        path = fetch(url, sha256, os.environ, log=lambda m: None)
        cmd = [self.uv, "pip", "install", "-q", "--python", str(self.venv / "bin" / "python"),
               "--reinstall-package", "vllm-engine", str(path), *torch_source_args(self.variant)]
        if is_variant_wheel(path.name):
            cmd += UV_PREVIEW
        return subprocess.run(cmd, capture_output=True, text=True)

    def run(self, command: list[str]) -> int:
        env = {**os.environ, "VIRTUAL_ENV": str(self.venv),
               "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        for leak in ("PYTHONHOME", "PYTHONPATH"):  # would shadow the installed wheel
            env.pop(leak, None)
        try:
            return subprocess.run(command, env=env, cwd=self.scratch).returncode
        except OSError as exc:
            raise UserError(f"cannot run {command[0]!r}: {exc}") from None


def test_commit(inst: Installer, commit: str, command: list[str]) -> Step:
    found = inst.wheel(commit)
    if found is None:
        return Step(commit, SKIP, f"no {inst.variant} wheel published")
    res = inst.install(*found)
    if res.returncode != 0:
        cause = " ".join(res.stderr.split()) or f"uv exited {res.returncode}"  # one line
        raise UserError(f"installing the {inst.variant} wheel of {commit[:12]} failed: "
                        f"{cause[:400]} (an error, not a skip: usually the environment; check "
                        "torch's index or VLLM_TORCH_FIND_LINKS, and the network)")
    code = inst.run(command)
    if code == 0:
        return Step(commit, GOOD)
    if code == 125:
        return Step(commit, SKIP, "the command asked to skip (exit 125)")
    return Step(commit, BAD, f"exit {code}")


def bisect(root: Path, good: str, bad: str, command: list[str], index: str, variant: str,
           log=print) -> Result:
    g, b = gitutil.rev(root, good), gitutil.rev(root, bad)
    if g is None:
        raise UserError(f"--good {good!r} is not a revision of the repository at {root}")
    if b is None:
        raise UserError(f"--bad {bad!r} is not a revision of the repository at {root}")
    if gitutil.git(root, "merge-base", "--is-ancestor", g, b, check=False) is None:
        raise UserError(f"--good {good} is not an ancestor of --bad {bad} on this history")
    between = (gitutil.git(root, "rev-list", "--first-parent", f"{g}..{b}") or "").split()
    if not between:
        raise UserError("--good and --bad are the same commit: nothing to bisect")
    seq = [g] + list(reversed(between))  # oldest first: seq[0] is --good, seq[-1] is --bad
    skipped: set[int] = set()
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="vllm-bisect-") as tmp:
        inst = Installer(Path(tmp), index, variant, log)

        def test(i: int, note: str = "") -> Step:
            step = test_commit(inst, seq[i], command)
            steps.append(step)
            log(f"[{len(steps)}] {seq[i][:12]} {step.verdict}"
                + (f" ({step.reason})" if step.reason else "") + note
                + f"  — {gitutil.subject(root, seq[i])}")
            if step.verdict == SKIP:
                skipped.add(i)
            return step

        # Without these two, a command that passes everywhere still "finds" a first
        # bad commit (the last one), and one that fails everywhere the first.
        lo = _end(test, range(0, len(seq) - 1), GOOD, "--good", good)
        hi = _end(test, range(len(seq) - 1, lo, -1), BAD, "--bad", bad)
        while True:
            untested = [i for i in range(lo + 1, hi) if i not in skipped]
            if not untested:
                break
            mid = (lo + hi) / 2
            i = min(untested, key=lambda k: (abs(k - mid), k))
            verdict = test(i).verdict
            if verdict == GOOD:
                lo = i
            elif verdict == BAD:
                hi = i
    rng = seq[lo + 1: hi + 1]
    if len(rng) == 1:
        return Result(seq[hi], rng, steps)
    return Result(None, rng, steps)


def _end(test, order: range, want: str, flag: str, given: str) -> int:
    """The index of the end's verdict: the end itself, or where it has no wheel
    (or the command skips it), the nearest commit inward that has one."""
    for i in order:
        step = test(i, f" (the {flag} end)")
        if step.verdict == SKIP:
            continue
        if step.verdict != want:
            at = "" if i == order[0] else f" (the nearest testable commit, {step.commit[:12]})"
            does = "passes" if step.verdict == GOOD else f"fails ({step.reason})"
            fix = "passes" if want == GOOD else "fails"
            raise UserError(f"the command {does} at {flag} {given}{at}: nothing to bisect; "
                            f"give a {flag} revision where it {fix}")
        return i
    raise UserError(f"{flag} {given}: no commit from there to the other end could be tested "
                    "(no wheel published, or the command skipped); nothing to bisect")


def install_command(index: str, commit: str, variant: str) -> str:
    backend = get_variant(variant).torch_backend
    return (f"uv pip install vllm-engine --extra-index-url {index}/{commit}/{variant} "
            f"--index-strategy first-index" + (f" --torch-backend {backend}" if backend else ""))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", help="wheel variant (default: detected, as tools.target)")
    p.add_argument("--index", help="wheel index: folder, file:// or http(s):// (default: "
                   "VLLM_PRECOMPILED_WHEEL_INDEX or the project's folder index)")
    p.add_argument("--repo", default=".", help="the git repository (default: .)")
    p.add_argument("command", nargs="+", help="the test command, after --")


def _variant(given: str | None) -> str:
    return get_variant(given).label if given else detect().variant.label


def _check_index(index: str) -> None:
    if "://" not in index or index.startswith("file://"):
        folder = Path(index.removeprefix("file://"))
        if not folder.is_dir():
            raise UserError(f"--index {index}: no such folder")
    else:
        get_bytes(f"{index}/")  # an unreachable server fails here, by name


#: run-one's exit on an error (an install that failed, say): git bisect run stops
#: on 128-255, where 2 would have marked the commit bad
ABORT = 128


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    one = bool(argv) and argv[0] == "run-one"
    try:
        if one:
            p = argparse.ArgumentParser(
                prog="python -m tools.bisect run-one",
                description="Test one revision: install its wheel, run the command; exit 0 good, "
                            "125 skip (no wheel), 1 bad, 128 error (git bisect run stops). For "
                            "`git bisect run python -m tools.bisect run-one HEAD -- CMD...`.")
            p.add_argument("rev", help="the revision to test (HEAD under git bisect run)")
            _common(p)
            a = p.parse_args(argv[1:])
            root = Path(a.repo)
            commit = gitutil.rev(root, a.rev)
            if commit is None:
                raise UserError(f"{a.rev!r} is not a revision of the repository at {root}")
            index = a.index or index_url(os.environ)
            _check_index(index)
            with tempfile.TemporaryDirectory(prefix="vllm-bisect-") as tmp:
                inst = Installer(Path(tmp), index, _variant(a.variant), print)
                step = test_commit(inst, commit, a.command)
            print(f"{commit[:12]} {step.verdict}" + (f" ({step.reason})" if step.reason else ""),
                  file=sys.stderr)
            return {GOOD: 0, SKIP: 125}.get(step.verdict, 1)

        p = argparse.ArgumentParser(
            prog="python -m tools.bisect", description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog="To drive git bisect yourself, one revision at a time:\n"
                   "  git bisect start --first-parent BAD GOOD\n"
                   "  git bisect run python -m tools.bisect run-one HEAD -- CMD...\n"
                   "(python -m tools.bisect run-one --help for its options)")
        p.add_argument("--good", required=True, help="a revision where CMD succeeds")
        p.add_argument("--bad", required=True, help="a later revision where CMD fails")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        _common(p)
        a = p.parse_args(argv)
        root = Path(a.repo)
        index = (a.index or index_url(os.environ)).rstrip("/")
        _check_index(index)
        variant = _variant(a.variant)
        log = (lambda m: print(m, file=sys.stderr)) if a.json else print
        r = bisect(root, a.good, a.bad, a.command, index, variant, log=log)
    except UserError as exc:
        if build_settings.debug():
            raise
        print(f"error: {exc}", file=sys.stderr)
        return ABORT if one else 2
    out = {
        "first_bad": r.first_bad,
        "subject": gitutil.subject(root, r.first_bad) if r.first_bad else None,
        "install": install_command(index, r.first_bad, variant) if r.first_bad else None,
        "candidates": r.candidates,
        "steps": [{"commit": s.commit, "verdict": s.verdict, "reason": s.reason} for s in r.steps],
        "variant": variant,
    }
    if a.json:
        print(json.dumps(out, indent=2))
    elif r.first_bad:
        print(f"\nfirst bad commit: {r.first_bad}\n  {out['subject']}\n"
              f"install it:\n  {out['install']}")
    else:
        print("\nskipped commits hide the answer; the first bad commit is one of:")
        for c in r.candidates:
            print(f"  {c}  {gitutil.subject(root, c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
