"""tools.reproducible: a wheel's archive depends on its contents alone."""
from __future__ import annotations

import zipfile

import pytest

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
