"""publish refuses a wheel file name outside the wheel spec before it touches
the index: parse_wheel_filename alone takes '?', '#' or a space in a tag, and
such a name then breaks verify, ls and prune."""
from __future__ import annotations

import shutil

import pytest

from helpers import make_wheel
from wheel_index.cli import main as cli

A, B = "a" * 40, "b" * 40


def tree(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("name", [
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-abi3-linux_x86_64?x=1#.whl",
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-abi3 -manylinux_2_34_x86_64.whl",
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-abi3-manylinux_2_34_x86_64 .whl",
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-abi3-manylinux_2_34_x86_64\n.whl",
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-abi3-manylinux_2_34_x86_64%2F.whl",
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-abi3-many\u00e9linux_x86_64.whl",
    "vllm_engine-0.1.dev3+g1234567.cpu-cp38-.abi3-manylinux_2_34_x86_64.whl",
])
def test_names_outside_the_spec_are_refused_in_one_line(tmp_path, capsys, name):
    idx = tmp_path / "index"
    first = make_wheel(tmp_path / "a", "0.1.dev3+g1234567.cpu", commit=A)
    assert cli(["publish", "--index", str(idx), "--commit", A, "--commit-time", "1", "--nightly",
                str(first)]) == 0
    before = tree(idx)
    odd = tmp_path / "odd" / name
    odd.parent.mkdir()
    shutil.copy(make_wheel(tmp_path / "b", "0.1.dev3+g1234567.cpu", commit=B), odd)
    capsys.readouterr()
    assert cli(["publish", "--index", str(idx), "--commit", B, "--commit-time", "2", "--nightly",
                str(odd)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a wheel file name as the wheel spec spells it" in err
    assert "Traceback" not in err
    assert tree(idx) == before
    # a folder that is not an index yet is not even made
    fresh = tmp_path / "fresh"
    assert cli(["publish", "--index", str(fresh), "--commit", B, "--commit-time", "2",
                str(odd)]) == 1
    assert not fresh.exists()
    # and the index still answers every command
    for command in (["verify"], ["ls"], ["prune", "--keep-commits", "5", "--dry-run"]):
        assert cli([command[0], "--index", str(idx), *command[1:]]) == 0, command


def test_a_spec_name_with_a_build_tag_is_taken(tmp_path):
    w = make_wheel(tmp_path / "w", "0.1.dev3+g1234567.cpu", commit=A)
    named = w.with_name("vllm_engine-0.1.dev3+g1234567.cpu-1b-cp38-abi3-"
                        "manylinux_2_34_x86_64.whl")
    w.rename(named)
    idx = tmp_path / "index"
    assert cli(["publish", "--index", str(idx), "--commit", A, "--commit-time", "1",
                str(named)]) == 0
    assert cli(["verify", "--index", str(idx)]) == 0
