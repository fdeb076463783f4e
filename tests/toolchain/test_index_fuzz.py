"""Property tests of the index's readers: wheel file names, METADATA, build
info and metadata.json documents, malformed in every way hypothesis finds,
end in the project's own UserError (never another exception) and write
nothing."""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from helpers import make_wheel
from tools.errors import UserError
from tools.precompiled.extract import extract_kernels
from tools.precompiled.select import pick_wheel
from wheel_index.documents import parse_metadata_json
from wheel_index.publish import publish
from wheel_index.storage import LocalStorage

A = "a" * 40
VERSION = "0.1.dev3+g1234567.cpu"
DIST_INFO = f"vllm_engine-{VERSION}.dist-info"
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def template():
    """The members of a good wheel (name -> bytes), and its file name."""
    with tempfile.TemporaryDirectory() as tmp:
        w = make_wheel(Path(tmp), VERSION, commit=A)
        with zipfile.ZipFile(w) as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        return members, w.name


def build(folder: Path, name: str, members: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    with zipfile.ZipFile(out, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    return out


def publish_refuses_or_succeeds(wheel: Path, index: Path) -> bool:
    """True when published; on a refusal, nothing may have been written."""
    try:
        publish(LocalStorage(index), A, [wheel], commit_time="1", log=lambda m: None)
        return True
    except UserError:
        assert not index.exists() or not any(index.rglob("*")), "a refusal wrote files"
        return False


name_chars = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))


@FAST
@given(st.one_of(
    st.text(name_chars, min_size=1, max_size=60).map(lambda s: s + ".whl"),
    st.text(name_chars, min_size=1, max_size=60),
    st.builds(lambda v, t: f"vllm_engine-{v}-{t}.whl", st.text(name_chars, max_size=30),
              st.text(name_chars, max_size=30)),
))
def test_wheel_file_names(template, name):
    assume(name not in (".", "..") and len(name.encode()) < 200)
    members, good = template
    with tempfile.TemporaryDirectory() as tmp:
        w = build(Path(tmp) / "in", name, members)
        if publish_refuses_or_succeeds(w, Path(tmp) / "index"):
            assert name == good


headers = st.lists(st.tuples(
    st.sampled_from(["Name", "Version", "Requires-Python", "Metadata-Version", "X"]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)), max_size=5)


@FAST
@given(st.one_of(
    st.binary(max_size=200),
    headers.map(lambda hs: "".join(f"{k}: {v}\n" for k, v in hs).encode()),
    st.text(max_size=30).map(lambda v: f"Name: vllm-engine\nVersion: {VERSION}\n"
                                       f"Requires-Python: {v}\n".encode()),
))
def test_metadata(template, metadata):
    members, good = template
    with tempfile.TemporaryDirectory() as tmp:
        w = build(Path(tmp) / "in", good, {**members, f"{DIST_INFO}/METADATA": metadata})
        publish_refuses_or_succeeds(w, Path(tmp) / "index")


build_infos = st.one_of(
    st.binary(max_size=100),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"variant": st.sampled_from(["cpu", "cu130", "x", ""]) | json_values},
                          optional={"git_commit": st.sampled_from([A, "unknown", "b" * 40])
                                    | json_values,
                                    "torch_requirement": json_values}
                          ).map(lambda d: json.dumps(d).encode()),
)


@FAST
@given(build_infos)
def test_build_info_at_publish(template, info):
    members, good = template
    with tempfile.TemporaryDirectory() as tmp:
        w = build(Path(tmp) / "in", good, {**members, "engine/_build_info.json": info})
        publish_refuses_or_succeeds(w, Path(tmp) / "index")


@FAST
@given(build_infos)
def test_build_info_in_precompiled_mode(template, info):
    members, good = template
    with tempfile.TemporaryDirectory() as tmp:
        w = build(Path(tmp) / "in", good, {**members, "engine/_build_info.json": info,
                                           "engine/_C.abi3.so": b"\x7fELF"})
        out = Path(tmp) / "pkg"
        try:
            extract_kernels(w, out, "cpu", "torch")
        except UserError:
            assert not out.exists() or not os.listdir(out), "a refusal wrote files"


def good_doc() -> dict:
    return {"commit": A, "variant": "cpu", "wheels": [{
        "filename": f"vllm_engine-{VERSION}-cp38-abi3-manylinux_2_34_x86_64.whl",
        "path": f"vllm-engine/vllm_engine-0.1.dev3%2Bg1234567.cpu-cp38-abi3-"
                "manylinux_2_34_x86_64.whl",
        "sha256": "0" * 64, "size": 10, "variant": "cpu", "commit": A,
        "python_tag": "cp38", "abi_tag": "abi3", "platform_tag": "manylinux_2_34_x86_64"}]}


def _mutate(doc: dict, where: str, key: str, value) -> dict:
    target = doc["wheels"][0] if where == "wheel" else doc
    if value is _DROP:
        target.pop(key, None)
    else:
        target[key] = value
    return doc


_DROP = object()


@FAST
@given(st.one_of(
    st.binary(max_size=100),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda where, key, value: json.dumps(_mutate(good_doc(), where, key, value)
                                                   if value is not _DROP else
                                                   _mutate(good_doc(), where, key, _DROP)).encode(),
              st.sampled_from(["top", "wheel"]),
              st.sampled_from(["commit", "wheels", "filename", "path", "sha256", "size",
                               "variant", "python_tag", "abi_tag", "platform_tag"]),
              json_values | st.just(_DROP) | st.text(max_size=40)),
))
def test_metadata_json(doc):
    try:
        meta = parse_metadata_json(doc, "metadata.json")
    except UserError:
        return
    # what passed the checks is safe to pick from and to join into a URL
    pick_wheel(meta, "cpu", "http://127.0.0.1:1/idx", "nightly/cpu")
    pick_wheel(meta, "cpu", "/tmp/idx", "nightly/cpu")


GOOD_ENTRY = {"filename": "w.whl", "name": "vllm-engine", "version": VERSION, "variant": "cpu",
              "python_tag": "cp38", "abi_tag": "abi3", "platform_tag": "any", "sha256": "0" * 64,
              "size": 1, "metadata_sha256": "1" * 64, "requires_python": None,
              "upload_time": "2026-01-01T00:00:00Z", "commit": A, "commit_time": 1}


@FAST
@given(st.one_of(
    st.binary(max_size=100),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda key, value: json.dumps({**GOOD_ENTRY, key: value}).encode(),
              st.sampled_from(sorted(GOOD_ENTRY)), json_values | st.text(max_size=20)),
))
def test_entry_records(data):
    """The records pages are rendered from, read back from storage."""
    from wheel_index.wheels import WheelEntry

    try:
        e = WheelEntry.from_json(data, "x.entry.json")
    except UserError:
        return
    # what publish and the pages do with a record that passed
    from wheel_index import pages

    sorted([e, e], key=lambda x: (Version(x.version), x.filename))
    pages.project_html([e], "nightly/cpu")
    pages.project_json([e], "nightly/cpu")
    pages.level_metadata([e], "nightly/cpu", {"commit": A})

