"""Which precompiled wheel: in-process, on small git repositories (a branch,
a worktree, a shallow clone, no git at all) and a folder index of synthetic
wheels."""
from __future__ import annotations

import shutil

import pytest

from helpers import make_wheel, run
from tools.errors import UserError
from tools.precompiled.select import choose_wheel
from wheel_index.publish import publish
from wheel_index.storage import open_storage


def git(repo, *args):
    return run(["git", *args], cwd=repo).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """main with 3 commits (a wheel for the first two), a feature branch off the second."""
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    git(origin, "config", "user.email", "t@example.com")
    git(origin, "config", "user.name", "t")
    (origin / "csrc").mkdir()
    commits = []
    for i in range(3):
        (origin / "csrc" / "k.cpp").write_text(f"// {min(i, 1)}\n")
        (origin / "notes.txt").write_text(f"{i}\n")
        git(origin, "add", "-A")
        git(origin, "commit", "-qm", f"main {i}")
        commits.append(git(origin, "rev-parse", "HEAD"))
    git(origin, "checkout", "-q", "-b", "feature", commits[1])
    (origin / "notes.txt").write_text("feature\n")
    git(origin, "commit", "-qam", "feature work")
    git(origin, "checkout", "-q", "main")
    idx = open_storage(str(tmp_path / "index"))
    for c in commits[:2]:
        publish(idx, c, [make_wheel(tmp_path / "w" / c, f"0.1.dev1+g{c[:9]}.cpu", commit=c)],
                commit_time="1", log=lambda m: None)
    return origin, tmp_path / "index", commits


def env(index, **kw):
    return {"VLLM_PRECOMPILED_WHEEL_INDEX": str(index), "VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu",
            **kw}


def test_branch_uses_its_merge_base(repo):
    origin, index, commits = repo
    git(origin, "checkout", "-q", "feature")
    c = choose_wheel(origin, env(index, VLLM_PRECOMPILED_BASE_REF="main"), log=lambda m: None)
    assert c.commit == commits[1] and c.fallback_from is None and c.sha256


def test_worktree(repo, tmp_path):
    origin, index, commits = repo
    wt = tmp_path / "wt"
    git(origin, "worktree", "add", "-q", str(wt), "feature")
    c = choose_wheel(wt, env(index), log=lambda m: None)
    assert c.commit == commits[1]


def test_detached_head_and_fallback_along_main(repo):
    origin, index, commits = repo
    git(origin, "checkout", "-q", "--detach", commits[2])
    said = []
    c = choose_wheel(origin, env(index), log=said.append)
    # commits[2] has no wheel; commits[1]'s kernels come from identical inputs
    assert c.commit == commits[1] and c.fallback_from == commits[2]
    assert any("identical" in m for m in said)


def test_shallow_clone_says_what_to_run(repo, tmp_path):
    origin, index, _ = repo
    shallow = tmp_path / "shallow"
    run(["git", "clone", "-q", "--depth", "1", "--no-single-branch", f"file://{origin}", shallow])
    git(shallow, "checkout", "-q", "feature")
    with pytest.raises(UserError, match="shallow clone.*git fetch --unshallow"):
        choose_wheel(shallow, env(index), log=lambda m: None)


def test_no_git_metadata_asks_for_a_commit_or_location(repo, tmp_path):
    origin, index, _ = repo
    tarball = tmp_path / "tarball"
    shutil.copytree(origin, tarball, ignore=shutil.ignore_patterns(".git"))
    with pytest.raises(UserError, match="VLLM_PRECOMPILED_WHEEL_COMMIT.*VLLM_PRECOMPILED_WHEEL_LOCATION"):
        choose_wheel(tarball, env(index), log=lambda m: None)


def test_explicit_commit_and_bad_values(repo):
    origin, index, commits = repo
    assert choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_COMMIT=commits[1]),
                        log=lambda m: None).commit == commits[1]
    # commits[0] was built from other kernels than this checkout has
    with pytest.raises(UserError, match="changes compiled inputs since .*: csrc/k.cpp"):
        choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_COMMIT=commits[0]),
                     log=lambda m: None)
    with pytest.raises(UserError, match="neither a full 40-hex commit nor 'nightly'"):
        choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_COMMIT="abc"), log=lambda m: None)
    with pytest.raises(UserError, match="no precompiled cpu wheel for " + commits[2]):
        choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_COMMIT=commits[2]),
                     log=lambda m: None)
    with pytest.raises(UserError, match="valid variants"):
        choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_VARIANT="cu118"),
                     log=lambda m: None)


def test_not_found_names_index_commit_variant_and_the_variables(repo):
    origin, index, commits = repo
    with pytest.raises(UserError) as exc:
        choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_COMMIT=commits[2]),
                     log=lambda m: None)
    msg = str(exc.value)
    assert "\n" not in msg
    for needed in (str(index), commits[2], "cpu", "VLLM_PRECOMPILED_WHEEL_INDEX",
                   "VLLM_PRECOMPILED_WHEEL_COMMIT", "VLLM_PRECOMPILED_WHEEL_VARIANT"):
        assert needed in msg, needed


def test_an_index_folder_that_does_not_exist_is_named(repo, tmp_path, monkeypatch):
    origin, _, _ = repo
    with pytest.raises(UserError, match=r"VLLM_PRECOMPILED_WHEEL_INDEX=.*missing: no such folder"):
        choose_wheel(origin, env(tmp_path / "missing"), log=lambda m: None)
    import tools.precompiled.select as select

    monkeypatch.setattr(select, "DEFAULT_WHEEL_INDEX", tmp_path / "no-index")
    with pytest.raises(UserError, match="VLLM_PRECOMPILED_WHEEL_INDEX is unset and the "
                                        "project's folder index .*no-index does not exist"):
        choose_wheel(origin, {"VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu"}, log=lambda m: None)
    with pytest.raises(UserError, match="use a folder, file://"):
        choose_wheel(origin, env("s3://bucket/x"), log=lambda m: None)


@pytest.mark.parametrize("fragment", ["#sha256=../../etc", "#sha256=" + "g" * 64,
                                      "#sha256=" + "a" * 63, "#md5=abc"])
def test_location_fragment_must_be_a_sha256(repo, tmp_path, fragment):
    origin, _, _ = repo
    with pytest.raises(UserError, match="VLLM_PRECOMPILED_WHEEL_LOCATION"):
        choose_wheel(origin, {"VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu",
                              "VLLM_PRECOMPILED_WHEEL_LOCATION": f"/x/w.whl{fragment}"},
                     log=lambda m: None)
    good = choose_wheel(origin, {"VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu",
                                 "VLLM_PRECOMPILED_WHEEL_LOCATION": "/x/w.whl#sha256=" + "A" * 64},
                        log=lambda m: None)
    assert good.sha256 == "a" * 64


@pytest.mark.parametrize("change,says", [
    (lambda d: d.update(commit="$(rm -rf ~)"), "commit .* is not 40 lowercase hex"),
    (lambda d: d["wheels"][0].update(sha256="../../x"), "is not 64 lowercase hex"),
    (lambda d: d["wheels"][0].update(path="https://evil.example/w.whl"), "not a plain relative"),
    (lambda d: d["wheels"][0].update(path="../other.whl"), "does not end in its filename"),
    (lambda d: d["wheels"][0].update(path="..%2F..%2F" + d["wheels"][0]["path"]),
     "not a plain relative link"),
    (lambda d: d["wheels"][0].update(path="../../../../../../" + d["wheels"][0]["path"]),
     "leads out of the index"),
    (lambda d: d["wheels"][0].pop("python_tag"), "python_tag"),
    (lambda d: d.update(wheels="all"), "'wheels' must be a list"),
])
def test_nightly_metadata_is_checked_before_use(repo, change, says):
    origin, index, commits = repo
    publish(open_storage(str(index)), commits[1],
            [make_wheel(index.parent / "n", f"0.1.dev1+g{commits[1][:9]}.cpu", commit=commits[1])],
            nightly=True, commit_time="1", log=lambda m: None)
    doc_path = index / "nightly" / "cpu" / "metadata.json"
    import json

    doc = json.loads(doc_path.read_text())
    change(doc)
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=says):
        choose_wheel(origin, env(index, VLLM_PRECOMPILED_WHEEL_COMMIT="nightly"),
                     log=lambda m: None)
