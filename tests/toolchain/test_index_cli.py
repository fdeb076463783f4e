"""`python -m wheel_index` on paths that are not an index, verify's two modes,
and S3 prune when S3 refuses some deletes."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, make_wheel
from tools.errors import UserError
from wheel_index import maintain
from wheel_index.cli import main as cli
from wheel_index.publish import publish
from wheel_index.storage import open_storage

A, B = "a" * 40, "b" * 40


def wheel(tmp_path, commit=A):
    return make_wheel(tmp_path / "w" / commit[:6], "0.1.dev3+g1234567.cpu", commit=commit)


def _not_an_index(tmp_path):
    d = tmp_path / "src"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("hi")
    return d


def _empty(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


@pytest.mark.parametrize("command", [["ls"], ["verify"], ["verify", "--full"],
                                     ["prune", "--keep-commits", "1"]])
@pytest.mark.parametrize("make,says", [
    (lambda t: t / "nonexistent", "no such folder"),
    (lambda t: REPO / "README.md", "is a file"),
    (_not_an_index, "is not a wheel index"),
    (_empty, "is empty"),
])
def test_every_command_refuses_what_is_not_an_index(tmp_path, command, make, says):
    given = make(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "wheel_index", command[0], "--index",
                           str(given), *command[1:]], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: --index {given}")


@pytest.mark.parametrize("make,says", [(lambda t: REPO / "README.md", "is a file"),
                                       (_not_an_index, "is not a wheel index")])
def test_publish_refuses_a_file_or_a_folder_of_other_things(tmp_path, capsys, make, says):
    given = make(tmp_path)
    before = sorted(p.name for p in given.iterdir()) if given.is_dir() else given.read_bytes()
    assert cli(["publish", "--index", str(given), "--commit", A, "--commit-time", "1",
                str(wheel(tmp_path))]) == 1
    assert says in capsys.readouterr().err
    assert before == (sorted(p.name for p in given.iterdir()) if given.is_dir()
                      else given.read_bytes())


def test_publish_creates_a_new_index(tmp_path):
    assert cli(["publish", "--index", str(tmp_path / "new" / "index"), "--commit", A,
                "--commit-time", "1", str(wheel(tmp_path))]) == 0
    assert cli(["ls", "--index", str(tmp_path / "new" / "index")]) == 0


def test_verify_quick_reads_sizes_full_reads_hashes(tmp_path, capsys):
    idx = tmp_path / "index"
    w = wheel(tmp_path)
    cli(["publish", "--index", str(idx), "--commit", A, "--commit-time", "5", str(w)])
    stored = next(idx.glob(f"{A}/cpu/vllm-engine/*.whl"))
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only a hash sees it
    stored.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli(["verify", "--index", str(idx)]) == 0
    assert "(quick: wheel sizes and ETags from the listing" in capsys.readouterr().out
    assert cli(["verify", "--index", str(idx), "--full"]) == 1
    out = capsys.readouterr().out
    assert "(full: every wheel's sha256 checked)" in out and "has sha256" in out
    stored.write_bytes(bytes(data) + b"more")
    assert cli(["verify", "--index", str(idx)]) == 1
    assert "differs from the entry record" in capsys.readouterr().out


def test_verify_quick_does_not_read_wheels(tmp_path):
    store = open_storage(str(tmp_path / "index"))
    publish(store, A, [wheel(tmp_path)], nightly=True, commit_time="1", log=lambda m: None)
    read = []
    real = store.read
    store.read = lambda key: read.append(key) or real(key)
    assert maintain.verify(store, log=lambda m: None) == []
    assert not [k for k in read if k.endswith(".whl")]
    assert maintain.verify(store, log=lambda m: None, full=True) == []
    assert [k for k in read if k.endswith(".whl")]


def test_verify_quick_sees_a_replaced_s3_object_by_its_etag(s3_env, tmp_path):
    store = open_storage(f"s3://{s3_env}/wheels")
    w = wheel(tmp_path)
    publish(store, A, [w], commit_time="1", log=lambda m: None)
    assert maintain.verify(store, log=lambda m: None) == []
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    store.client.put_object(Bucket=s3_env, Key=f"wheels/{A}/cpu/vllm-engine/{w.name}",
                            Body=bytes(data))
    read = []
    real = store.read
    store.read = lambda key: read.append(key) or real(key)
    problems = maintain.verify(store, log=lambda m: None)
    assert any("replaced since it was published (ETag" in p for p in problems), problems
    assert not [k for k in read if k.endswith(".whl")]


class RefusingClient:
    """boto3's client, except that delete_objects refuses the wheels, as S3
    does per key (AccessDenied under a bucket policy, say) in a 200 answer."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def delete_objects(self, Bucket, Delete):
        ok = [o for o in Delete["Objects"] if not o["Key"].endswith(".whl")]
        refused = [o for o in Delete["Objects"] if o["Key"].endswith(".whl")]
        if ok:
            self.inner.delete_objects(Bucket=Bucket, Delete={"Objects": ok})
        return {"Deleted": ok, "Errors": [{"Key": o["Key"], "Code": "AccessDenied",
                                           "Message": "Access Denied"} for o in refused]}


def test_s3_prune_reports_keys_it_could_not_delete(s3_env, tmp_path, capsys, monkeypatch):
    store = open_storage(f"s3://{s3_env}/wheels")
    publish(store, A, [wheel(tmp_path, A)], commit_time="1", log=lambda m: None)
    publish(store, B, [wheel(tmp_path, B)], nightly=True, commit_time="2", log=lambda m: None)
    store.client = RefusingClient(store.client)
    with pytest.raises(UserError, match=rf"prune stopped at {A}: S3 could not delete \d+ key.*"
                                        r"\.whl \(AccessDenied: Access Denied\)"):
        maintain.prune(store, keep_commits=1, log=lambda m: None)
    assert store.read(f"{A}/cpu/vllm-engine/{wheel(tmp_path, A).name}") is not None
    # and through the command line: one line, non-zero
    import wheel_index.cli as cli_mod

    real_open = cli_mod.open_index

    def refusing(spec, **kw):
        s = real_open(spec, **kw)
        s.client = RefusingClient(s.client)
        return s

    monkeypatch.setattr(cli_mod, "open_index", refusing)
    capsys.readouterr()
    assert cli(["prune", "--index", f"s3://{s3_env}/wheels", "--keep-commits", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "AccessDenied" in err


def test_s3_index_that_is_empty_or_missing_is_refused(s3_env, capsys):
    assert cli(["ls", "--index", f"s3://{s3_env}/nothing-here"]) == 1
    assert "is empty" in capsys.readouterr().err
    assert cli(["verify", "--index", "s3://no-such-bucket-xyz/p"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_prune_dry_run_lists_what_it_would_remove_and_removes_nothing(tmp_path):
    idx = tmp_path / "index"
    store = open_storage(str(idx))
    publish(store, A, [wheel(tmp_path, A)], commit_time="1", log=lambda m: None)
    publish(store, B, [wheel(tmp_path, B)], nightly=True, commit_time="2", log=lambda m: None)
    files = {str(p) for p in idx.rglob("*") if p.is_file()}

    def prune(*args):
        proc = subprocess.run([sys.executable, "-m", "wheel_index", "prune", "--index", str(idx),
                               *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = prune("--keep-commits", "1", "--dry-run")
    assert f"would remove {A}" in out and B not in out
    for key in store.list(A):  # every file, by its key
        assert f"    {key}\n" in out
    assert "dry run: would remove 1 commit(s)" in out and "nothing was removed" in out
    out = prune("--keep-commits", "5", "--dry-run")  # nothing to do: said, not silent
    assert out == "nothing to remove: 2 commit(s) published, all kept\n"
    assert {str(p) for p in idx.rglob("*") if p.is_file()} == files
    out = prune("--keep-commits", "1")
    assert f"removing {A}" in out and "removed 1 commit(s)" in out
    assert maintain.published(store)[0].commit == B and len(maintain.published(store)) == 1
