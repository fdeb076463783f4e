"""tools.bisect on a repository of 34 commits with a small wheel published per
commit (one commit changes behaviour), plus one run over real engine wheels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from helpers import REPO, make_wheel, run, torch_wheelhouse
from wheel_index.publish import publish
from wheel_index.storage import open_storage

N, BREAKS_AT = 34, 21
CHECK = ["python", "-c", "import engine, sys; sys.exit(engine.VALUE)"]


def git(repo, *args):
    return run(["git", *args], cwd=repo).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(repo, index, commits oldest first); commit BREAKS_AT introduces VALUE = 1."""
    root = tmp_path_factory.mktemp("bisect")
    repo, idx, wheels = root / "repo", root / "index", root / "wheels"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    commits = []
    for i in range(N):
        (repo / "f.txt").write_text(f"{i}\n")
        git(repo, "add", "f.txt")
        git(repo, "commit", "-qm", f"change {i}" + (" (the regression)" if i == BREAKS_AT else ""))
        commits.append(git(repo, "rev-parse", "HEAD"))
    storage = open_storage(str(idx))
    for i, c in enumerate(commits):
        w = make_wheel(wheels / str(i), f"0.1.dev{i}+g{c[:9]}.cpu", commit=c,
                       body=f"VALUE = {int(i >= BREAKS_AT)}\n")
        publish(storage, c, [w], commit_time=str(1000 + i), log=lambda m: None)
    return repo, idx, commits


def bisect(repo, idx, *args, check=True):
    res = subprocess.run([sys.executable, "-m", "tools.bisect", "--variant", "cpu", "--index",
                          str(idx), "--repo", str(repo), *args], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_bisect_names_the_commit_in_few_steps(history):
    repo, idx, commits = history
    head, status = git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")
    res = bisect(repo, idx, "--good", commits[0], "--bad", commits[-1], "--json", "--", *CHECK)
    out = json.loads(res.stdout)
    assert out["first_bad"] == commits[BREAKS_AT]
    assert out["subject"] == f"change {BREAKS_AT} (the regression)"
    assert out["install"].startswith(f"uv pip install vllm-engine --extra-index-url {idx}/"
                                     f"{commits[BREAKS_AT]}/cpu")
    # the two ends first, then 32 candidates between them: ceil(log2(33)) = 6
    assert len(out["steps"]) <= 2 + 6
    assert [s["commit"] for s in out["steps"][:2]] == [commits[0], commits[-1]]
    assert [s["verdict"] for s in out["steps"][:2]] == ["good", "bad"]
    # the user's checkout is untouched
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == status


def test_unbuilt_commits_are_skipped(history, tmp_path):
    repo, idx, commits = history
    import shutil

    holes = tmp_path / "index"
    shutil.copytree(idx, holes)
    for i in (16, 17, 19, 24, 25):
        shutil.rmtree(holes / commits[i])
    out = json.loads(bisect(repo, holes, "--good", commits[0], "--bad", commits[-1], "--json",
                            "--", *CHECK).stdout)
    assert out["first_bad"] == commits[BREAKS_AT]
    assert any(s["verdict"] == "skip" for s in out["steps"])


def test_skips_that_hide_the_answer_give_the_honest_range(history, tmp_path):
    repo, idx, commits = history
    import shutil

    holes = tmp_path / "index"
    shutil.copytree(idx, holes)
    for i in (19, 20, 21):
        shutil.rmtree(holes / commits[i])
    res = bisect(repo, holes, "--good", commits[0], "--bad", commits[-1], "--", *CHECK)
    assert "skipped commits hide the answer" in res.stdout
    for i in (19, 20, 21):
        assert commits[i] in res.stdout
    out = json.loads(bisect(repo, holes, "--good", commits[0], "--bad", commits[-1], "--json",
                            "--", *CHECK).stdout)
    # 18 tested good and 22 bad: the first bad is one of 19..22, as git bisect says
    assert out["first_bad"] is None and out["candidates"] == commits[19:23]


def test_exit_125_skips(history):
    repo, idx, commits = history
    skip_one = ["python", "-c",
                 "import engine, sys, importlib.metadata as m; "
                 "n = int(m.version('vllm-engine').split('dev')[1].split('+')[0]); "
                 "sys.exit(125 if n == 16 else engine.VALUE)"]  # 16: the first midpoint
    out = json.loads(bisect(repo, idx, "--good", commits[0], "--bad", commits[-1], "--json",
                            "--", *skip_one).stdout)
    assert out["first_bad"] == commits[BREAKS_AT]
    assert out["steps"][2] == {"commit": commits[16], "verdict": "skip",
                               "reason": "the command asked to skip (exit 125)"}


@pytest.mark.parametrize("args,message", [
    (["--good", "nope", "--bad", "HEAD"], "--good 'nope' is not a revision"),
    (["--good", "HEAD~3", "--bad", "HEAD~5"], "is not an ancestor"),
])
def test_unknown_revisions_are_clear_errors(history, args, message):
    repo, idx, _ = history
    res = bisect(repo, idx, *args, "--", *CHECK, check=False)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_bad_index_is_a_clear_error(history, tmp_path):
    repo, _, commits = history
    res = bisect(repo, tmp_path / "nowhere", "--good", commits[0], "--bad", commits[-1], "--",
                 *CHECK, check=False)
    assert res.returncode == 2 and "no such folder" in res.stderr
    res = bisect(repo, "http://127.0.0.1:9", "--good", commits[0], "--bad", commits[-1], "--",
                 *CHECK, check=False)
    assert res.returncode == 2 and "cannot reach the wheel index at http://127.0.0.1:9" in res.stderr


def test_run_one_drives_git_bisect_run(history, tmp_path):
    repo, idx, commits = history
    work = tmp_path / "work"
    run(["git", "clone", "-q", repo, work])
    git(work, "bisect", "start", commits[-1], commits[0])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(["git", "bisect", "run", sys.executable, "-m", "tools.bisect", "run-one",
                          "HEAD", "--variant", "cpu", "--index", str(idx), "--", *CHECK],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert f"{commits[BREAKS_AT]} is the first bad commit" in res.stdout, res.stdout + res.stderr


@pytest.mark.slow
def test_bisect_over_real_engine_wheels(cpu_wheel, tmp_path):
    """Good: the session's real cpu wheel; bad: a commit that breaks `engine`,
    built for real; then a commit that only touches docs (no wheel: skipped)."""
    good = json.loads(zipfile.ZipFile(cpu_wheel).read("engine/_build_info.json"))["git_commit"]
    repo = tmp_path / "repo"
    run(["git", "clone", "-q", REPO, repo])
    git(repo, "checkout", "-q", "-B", "main", good)
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    with open(repo / "engine" / "__init__.py", "a") as f:
        f.write("\nBROKEN = True\n")
    git(repo, "commit", "-qam", "break engine")
    bad = git(repo, "rev-parse", "HEAD")
    out = tmp_path / "wheels"
    from helpers import UV

    run(["bash", repo / "ci" / "build-wheel.sh", "cpu", out],
        env={"PYTHON": sys.executable, "UV": UV, "VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse())})
    with open(repo / "README.md", "a") as f:
        f.write("\ndocs\n")
    git(repo, "commit", "-qam", "docs")
    idx = open_storage(str(tmp_path / "index"))
    publish(idx, good, [cpu_wheel], commit_time="1", log=lambda m: None)
    publish(idx, bad, list(out.glob("*.whl")), commit_time="2", log=lambda m: None)
    check = ["python", "-c", "import engine, sys; sys.exit(1 if getattr(engine, 'BROKEN', "
             "False) else 0)"]
    res = subprocess.run([sys.executable, "-m", "tools.bisect", "--variant", "cpu", "--index",
                          str(tmp_path / "index"), "--repo", str(repo), "--good", good, "--bad",
                          "HEAD", "--json", "--", *check], cwd=REPO, capture_output=True,
                         text=True, timeout=900,
                         env={**os.environ, "VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse())})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["first_bad"] == bad


@pytest.mark.parametrize("command,says", [
    (["python", "-c", "pass"], "the command passes at --bad"),
    (["python", "-c", "raise SystemExit(3)"], "the command fails (exit 3) at --good"),
])
def test_ends_that_do_not_disagree_are_refused(history, command, says):
    """A command that passes (or fails) everywhere has no first bad commit."""
    repo, idx, commits = history
    res = bisect(repo, idx, "--good", commits[0], "--bad", commits[-1], "--", *command,
                 check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stdout + res.stderr
    assert says in res.stderr and "first bad commit" not in res.stdout


def test_an_end_without_a_wheel_gives_way_to_the_nearest_built_commit(history, tmp_path):
    repo, idx, commits = history
    import shutil

    holes = tmp_path / "index"
    shutil.copytree(idx, holes)
    for i in (0, 1, 33, 32):
        shutil.rmtree(holes / commits[i])
    out = json.loads(bisect(repo, holes, "--good", commits[0], "--bad", commits[-1], "--json",
                            "--", *CHECK).stdout)
    assert out["first_bad"] == commits[BREAKS_AT]
    assert [(s["commit"], s["verdict"]) for s in out["steps"][:6]] == [
        (commits[0], "skip"), (commits[1], "skip"), (commits[2], "good"),
        (commits[33], "skip"), (commits[32], "skip"), (commits[31], "bad")]


def _uninstallable(wheel):
    """The same wheel, asking for a Python that does not exist (uv refuses it)."""
    import base64
    import hashlib

    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    meta = next(n for n in members if n.endswith(".dist-info/METADATA"))
    members[meta] = members[meta].replace(b">=3.10", b">=3.99")
    digest = base64.urlsafe_b64encode(hashlib.sha256(members[meta]).digest()).rstrip(b"=")
    record = next(n for n in members if n.endswith(".dist-info/RECORD"))
    members[record] = b"\n".join(
        f"{meta},sha256={digest.decode()},{len(members[meta])}".encode()
        if line.startswith(meta.encode() + b",") else line
        for line in members[record].split(b"\n"))
    with zipfile.ZipFile(wheel, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    return wheel


def test_an_install_failure_is_an_error_naming_its_cause(history, tmp_path):
    """Not a skip: an environment problem must not read as an ambiguous bisect."""
    repo, idx, commits = history
    import shutil

    broken = tmp_path / "index"
    shutil.copytree(idx, broken)
    c = commits[16]  # the first midpoint
    w = _uninstallable(make_wheel(tmp_path / "w", f"0.1.dev16+g{c[:9]}.cpu", commit=c,
                                  body="VALUE = 0\n"))
    publish(open_storage(str(broken)), c, [w], force=True, commit_time="1016",
            log=lambda m: None)
    res = bisect(repo, broken, "--good", commits[0], "--bad", commits[-1], "--", *CHECK,
                 check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stdout + res.stderr
    assert f"installing the cpu wheel of {c[:12]} failed" in res.stderr and "3.99" in res.stderr
    # under git bisect run, an error stops the bisect (128) instead of marking the commit bad
    one = subprocess.run([sys.executable, "-m", "tools.bisect", "run-one", c, "--variant", "cpu",
                          "--index", str(broken), "--repo", str(repo), "--", *CHECK], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 128 and "failed" in one.stderr, one.stderr


@pytest.mark.parametrize("doc", ["README.md", "docs/bisect.md"])
def test_the_documented_example_names_revisions_this_repository_has(doc):
    import re

    text = (REPO / doc).read_text()
    examples = re.findall(r"python -m tools\.bisect --good (\S+) --bad (\S+)", text)
    assert examples, f"{doc} shows no bisect example"
    for good, bad in examples:
        for rev in (good, bad):
            res = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                                 cwd=REPO, capture_output=True, text=True)
            assert res.returncode == 0, f"{doc}: {rev} is not a revision of this repository"
