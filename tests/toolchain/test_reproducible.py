"""tools.reproducible: a wheel's archive depends on its contents alone; --compare
and ci/reproducible-check.sh check two builds of one commit, with diffoscope's
report where they differ."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from helpers import REPO, UV, torch_wheelhouse
from tools import reproducible
from tools.errors import UserError

FILES = {"engine/__init__.py": b"x = 1\n", "engine/_C.abi3.so": b"\x7fELF...",
         "engine/bin/tool": b"#!/bin/sh\n", "pkg-1.dist-info/RECORD": b"records\n",
         "pkg-1.dist-info/METADATA": b"Name: pkg\n", "pkg-1.dist-info/WHEEL": b"Wheel\n"}


def _wheel(path, order, when, umask_mode, dirs=True):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        if dirs:
            z.writestr(zipfile.ZipInfo("engine/", when), b"")
        for name in order:
            info = zipfile.ZipInfo(name, when)
            mode = 0o775 if name.endswith(("tool", ".so")) else umask_mode
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, FILES[name])
    return path


def test_two_archives_of_the_same_files_become_the_same_bytes(tmp_path):
    names = list(FILES)
    a = _wheel(tmp_path / "a.whl", names, (2026, 1, 2, 3, 4, 5), 0o664)
    b = _wheel(tmp_path / "b.whl", names[::-1], (2025, 6, 7, 8, 9, 10), 0o600, dirs=False)
    assert a.read_bytes() != b.read_bytes()
    assert reproducible.normalize(a, 1700000000) and reproducible.normalize(b, 1700000000)
    assert a.read_bytes() == b.read_bytes()
    assert not reproducible.normalize(a, 1700000000)  # a second pass changes nothing
    with zipfile.ZipFile(a) as z:
        infos = z.infolist()
        assert [i.filename for i in infos] == [
            "engine/_C.abi3.so", "engine/__init__.py", "engine/bin/tool",
            "pkg-1.dist-info/METADATA", "pkg-1.dist-info/WHEEL", "pkg-1.dist-info/RECORD"]
        assert {i.filename: z.read(i) for i in infos} == FILES  # contents untouched
        assert {i.date_time for i in infos} == {(2023, 11, 14, 22, 13, 20)}
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in infos}
        assert modes["engine/_C.abi3.so"] == modes["engine/bin/tool"] == 0o755
        assert modes["engine/__init__.py"] == modes["pkg-1.dist-info/RECORD"] == 0o644


def test_the_epoch_comes_from_source_date_epoch():
    assert reproducible.epoch_from_env({"SOURCE_DATE_EPOCH": "1700000000"}) == 1700000000
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH is not set"):
        reproducible.epoch_from_env({})
    with pytest.raises(UserError, match="whole seconds"):
        reproducible.epoch_from_env({"SOURCE_DATE_EPOCH": "yesterday"})


def test_a_file_that_is_not_a_wheel_is_one_line(tmp_path, capsys):
    (tmp_path / "x.whl").write_text("not a zip")
    assert reproducible.main([str(tmp_path / "x.whl"), "--epoch", "0"]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'x.whl'}: not a wheel (not a zip archive)\n"


def _pair(tmp_path, second_epoch):
    names = list(FILES)
    a = _wheel(tmp_path / "a" / "pkg-1-py3-none-any.whl", names, (2026, 1, 2, 3, 4, 5), 0o664)
    b = _wheel(tmp_path / "b" / "pkg-1-py3-none-any.whl", names[::-1], (2025, 6, 7, 8, 9, 10),
               0o600)
    reproducible.normalize(a, 1700000000)
    reproducible.normalize(b, second_epoch)
    return a, b


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return tmp_path


def test_compare_passes_two_identical_builds(dirs, capsys):
    a, b = _pair(dirs, 1700000000)
    assert reproducible.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("identical bytes: sha256 ") and out.err == ""


@pytest.mark.parametrize("diffoscope", [True, False])
def test_compare_shows_why_two_builds_differ(dirs, capsys, monkeypatch, diffoscope):
    """A timestamp that leaked (another epoch): diffoscope's report names the member
    and both dates; without diffoscope the members that differ are listed."""
    if diffoscope and not reproducible.shutil.which("diffoscope"):
        pytest.skip("diffoscope is not installed (apt-get install diffoscope-minimal)")
    if not diffoscope:
        monkeypatch.setattr(reproducible.shutil, "which", lambda name: None)
    a, b = _pair(dirs, 1600000000)
    assert reproducible.main(["--compare", str(a), str(b)]) == 1
    out = capsys.readouterr()
    assert out.err == f"error: two builds of one commit differ: {a} and {b} (the report above " \
                      "says where)\n"
    if diffoscope:
        assert "engine/__init__.py" in out.out and "23-Nov-14 22:13" in out.out, out.out
        assert "20-Sep-13 12:26" in out.out, out.out
    else:
        assert "date_time differs: engine/__init__.py: (2023, 11, 14, 22, 13, 20) != " \
               "(2020, 9, 13, 12, 26, 40)" in out.out
        assert "install diffoscope" in out.out


def test_compare_refuses_anything_but_two_files(dirs, capsys):
    a, b = _pair(dirs, 1700000000)
    assert reproducible.main(["--compare", str(a)]) == 2
    assert reproducible.main(["--compare", str(a), str(dirs / "missing.whl")]) == 2
    assert capsys.readouterr().err == "error: --compare takes two wheel files\n" * 2


def test_the_check_script_refuses_a_bad_argument_in_one_line():
    res = subprocess.run(["bash", REPO / "ci" / "reproducible-check.sh", "--bogus"],
                         capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: unknown argument --bogus; usage: ")
    res = subprocess.run(["bash", REPO / "ci" / "reproducible-check.sh", "--commit", "no-such-rev"],
                         capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    assert res.returncode == 2 and "error: no commit no-such-rev" in res.stderr


@pytest.mark.slow
def test_two_builds_of_one_commit_in_two_clones_are_byte_identical(tmp_path):
    """What the workflow's `reproducible` job runs: two cold builds (the compiler
    caches recompile), two clones at two paths, then the comparison."""
    res = subprocess.run(["bash", REPO / "ci" / "reproducible-check.sh", "cpu", "--keep",
                          tmp_path], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHON": sys.executable, "UV": UV,
                              "VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse())})
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1].startswith("identical bytes: sha256 ")
    (a,), (b,) = (tmp_path / "a").glob("*.whl"), (tmp_path / "b").glob("*.whl")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()
