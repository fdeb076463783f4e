"""nightly moves only forward in commit history: git's ancestry decides where
the repository publish runs in knows both commits, the recorded commit times
only where it does not."""
from __future__ import annotations


import pytest

from helpers import make_wheel, nightly, run
from wheel_index.publish import publish
from wheel_index.storage import open_storage


def git(repo, *args, env=None):
    return run(["git", *args], cwd=repo, env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """Three commits in a line whose committer dates run backwards (a rebase, a
    cherry-pick, a clock that was wrong): time says the oldest is the newest."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "t@example.com")
    git(r, "config", "user.name", "t")
    commits = []
    for i, when in enumerate((3000, 2000, 1000)):
        (r / "f").write_text(str(i))
        git(r, "add", "f")
        git(r, "commit", "-qm", f"c{i}", env={"GIT_COMMITTER_DATE": f"@{when} +0000",
                                              "GIT_AUTHOR_DATE": f"@{when} +0000"})
        commits.append(git(r, "rev-parse", "HEAD"))
    monkeypatch.chdir(r)  # publish asks git here, as the CLI does in a checkout
    return r, commits


def wheel(tmp_path, commit):
    return make_wheel(tmp_path / "w" / commit[:8], f"0.1.dev1+g{commit[:7]}.cpu", commit=commit)


def test_an_ancestor_leaves_nightly_where_it_is(repo, tmp_path):
    _, (c0, c1, c2) = repo
    store = open_storage(str(tmp_path / "index"))
    publish(store, c1, [wheel(tmp_path, c1)], nightly=True, log=lambda m: None)  # time from git
    said = []
    r = publish(store, c0, [wheel(tmp_path, c0)], nightly=True, log=said.append)
    assert r.nightly_moved == {"cpu": False} and nightly(store) == c1
    stays = [m for m in said if "stays at" in m]
    assert stays == [f"nightly stays at {c1}: {c0} is its ancestor (cpu, variants); nightly "
                     "only moves forward, --allow-rewind moves it back"]
    # the commit's own pages are still written
    assert store.read(f"{c0}/cpu/metadata.json") is not None


def test_a_descendant_moves_nightly_though_its_date_is_older(repo, tmp_path):
    _, (c0, c1, c2) = repo
    store = open_storage(str(tmp_path / "index"))
    publish(store, c0, [wheel(tmp_path, c0)], nightly=True, log=lambda m: None)
    r = publish(store, c2, [wheel(tmp_path, c2)], nightly=True, log=lambda m: None)
    assert r.nightly_moved == {"cpu": True} and nightly(store) == c2


def test_without_the_repository_commit_times_decide(repo, tmp_path, monkeypatch):
    _, (c0, c1, c2) = repo
    monkeypatch.chdir(tmp_path)  # not a repository: times are all there is
    store = open_storage(str(tmp_path / "index"))
    publish(store, c1, [wheel(tmp_path, c1)], nightly=True, commit_time="2000",
            log=lambda m: None)
    said = []
    publish(store, c2, [wheel(tmp_path, c2)], nightly=True, commit_time="1000", log=said.append)
    assert nightly(store) == c1 and any("git here cannot relate" in m for m in said)
    publish(store, c0, [wheel(tmp_path, c0)], nightly=True, commit_time="3000",
            log=lambda m: None)
    assert nightly(store) == c0
    publish(store, c2, [wheel(tmp_path, c2)], nightly=True, commit_time="1000",
            allow_rewind=True, log=lambda m: None)
    assert nightly(store) == c2


def test_the_cli_says_so_in_one_line(repo, tmp_path, capsys):
    from wheel_index.cli import main as cli

    _, (c0, c1, _) = repo
    idx = str(tmp_path / "index")
    assert cli(["publish", "--index", idx, "--commit", c1, "--nightly",
                str(wheel(tmp_path, c1))]) == 0
    capsys.readouterr()
    assert cli(["publish", "--index", idx, "--commit", c0, "--nightly",
                str(wheel(tmp_path, c0))]) == 0
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if "stays" in ln] == [
        f"nightly stays at {c1}: {c0} is its ancestor (cpu, variants); nightly only moves "
        "forward, --allow-rewind moves it back"]
