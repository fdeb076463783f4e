"""Variant wheels and the variants level, without a server: conversion,
properties, pages (PEP 503/691/658), views, verify."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from helpers import make_wheel
from tools.variants import VARIANTS
from wheel_index.maintain import verify
from wheel_index.publish import publish
from wheel_index.storage import LocalStorage
from wheel_index.variant_wheels import (
    SCHEMA,
    base_version,
    make_variant_wheel,
    properties,
    variants_json_name,
    wheel_label,
)
from wheel_index.wheels import inspect_wheel

C = "c" * 40
DEV = "0.1.dev5+gabc1234"


def _wheel(tmp_path, variant, version=DEV, commit=C, **kw):
    local = f"{version}.{variant}" if "+" in version else f"{version}+{variant}"
    return make_wheel(tmp_path / "in" / variant, local, commit=commit,
                      body=f"VARIANT = {variant!r}\n", **kw)


@pytest.mark.parametrize("version,base", [
    ("0.1.dev5+gabc1234.cpu", "0.1.dev5+gabc1234"),
    ("1.2.3+cpu", "1.2.3"),
    ("1.2.3", "1.2.3"),
])
def test_base_version_drops_only_the_variant(version, base):
    assert base_version(Version(version)) == base


def test_properties_follow_the_nvidia_provider_and_cpu_has_none():
    assert properties("cpu") == {}
    for label, v in VARIANTS.items():
        if v.device == "cuda":
            major = v.toolkit.split(".")[0]
            assert properties(label) == {"nvidia": {"cuda_version_lower_bound": [f"{major}.0"]}}
        elif v.device != "cpu":
            assert properties(label) is None  # no provider uv implements: no variant wheel


def _record_ok(zf: zipfile.ZipFile) -> None:
    record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    rows = {r[0]: r for r in csv.reader(io.StringIO(zf.read(record).decode()))}
    assert set(rows) == set(zf.namelist())
    for name, (_, digest, size) in rows.items():
        if name == record:
            assert digest == size == ""
            continue
        data = zf.read(name)
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(data), name


def test_variant_wheel_moves_the_variant_to_the_label(tmp_path):
    src = inspect_wheel(_wheel(tmp_path, "cu130"))
    out = make_variant_wheel(src, tmp_path)
    assert out.name == f"vllm_engine-{DEV}-cp38-abi3-manylinux_2_34_x86_64-cu130.whl"
    with zipfile.ZipFile(out) as zf, zipfile.ZipFile(src.path) as orig:
        names = zf.namelist()
        assert all(not n.startswith(f"vllm_engine-{DEV}.cu130") for n in names)
        meta = zf.read(f"vllm_engine-{DEV}.dist-info/METADATA").decode()
        assert f"\nVersion: {DEV}\n" in meta
        # everything else, the torch pin included, is the ordinary wheel's
        assert meta.replace(DEV, "V") == src.metadata.decode().replace(f"{DEV}.cu130", "V")
        doc = json.loads(zf.read(f"vllm_engine-{DEV}.dist-info/variant.json"))
        assert doc["$schema"] == SCHEMA
        assert doc["variants"] == {"cu130": properties("cu130")}
        assert set(doc["default-priorities"]["namespace"]) == set(doc["providers"])
        for name in orig.namelist():  # the package files are the same bytes
            if ".dist-info/" not in name:
                assert zf.read(name) == orig.read(name)
        _record_ok(zf)
    (tmp_path / "again").mkdir()
    again = make_variant_wheel(src, tmp_path / "again")
    assert again.read_bytes() == out.read_bytes()  # deterministic: republishing is a no-op


def test_pip_cannot_parse_a_variant_wheel_name_as_an_ordinary_wheel(tmp_path):
    out = make_variant_wheel(inspect_wheel(_wheel(tmp_path, "cpu")), tmp_path)
    # Six dash-separated fields: an ordinary parser reads "cp38" as a build tag,
    # which must start with a digit, so it refuses the file instead of installing it.
    with pytest.raises(Exception):
        parse_wheel_filename(out.name)


def _publish_all(tmp_path, storage, variants, **kw):
    for v in variants:  # one publisher per variant, as CI runs them
        publish(storage, C, [_wheel(tmp_path, v)], commit_time="100", log=lambda m: None, **kw)


def test_every_publish_writes_the_commit_variants_level(tmp_path):
    storage = LocalStorage(tmp_path / "idx")
    _publish_all(tmp_path, storage, ["cpu", "cu130", "cu129", "rocm700"])
    proj = f"{C}/variants/vllm-engine"
    page = storage.read(f"{proj}/index.html").decode()
    for label in ("null", "cu129", "cu130"):  # the cpu build is PEP 825's null variant
        assert f"manylinux_2_34_x86_64-{label}.whl</a>" in page
    assert "rocm700" not in page  # no provider can detect it
    assert "%2B" in page and "+gabc1234-cp38" not in page.split(">vllm")[0]
    assert 'data-core-metadata="sha256=' in page and "data-requires-python" in page
    doc = json.loads(storage.read(f"{proj}/{variants_json_name(DEV)}"))
    assert sorted(doc["variants"]) == ["cu129", "cu130", "null"]
    assert f">{variants_json_name(DEV)}</a>" in page
    api = json.loads(storage.read(f"{proj}/index.json"))
    assert api["meta"]["api-version"] == "1.1" and api["versions"] == [DEV]
    assert {f["filename"] for f in api["files"]} == {
        *(f"vllm_engine-{DEV}-cp38-abi3-manylinux_2_34_x86_64-{v}.whl"
          for v in ("null", "cu129", "cu130")), variants_json_name(DEV)}
    for f in api["files"]:
        if f["filename"].endswith(".whl"):
            meta = storage.read(f"{proj}/{f['filename']}.metadata")
            assert hashlib.sha256(meta).hexdigest() == f["core-metadata"]["sha256"]
            assert f"Version: {DEV}" in meta.decode()
    level = json.loads(storage.read(f"{C}/variants/metadata.json"))
    assert level["commit"] == C and level["level"] == "variants"
    assert {w["variant"] for w in level["wheels"]} == {"cpu", "cu129", "cu130"}
    assert storage.read("nightly/variants/metadata.json") is None  # only with --nightly
    assert verify(storage, log=lambda m: None) == []
    # per-variant levels are untouched by all this
    assert json.loads(storage.read(f"{C}/cpu/metadata.json"))["wheels"][0]["filename"] == \
        f"vllm_engine-{DEV}.cpu-cp38-abi3-manylinux_2_34_x86_64.whl"


def test_nightly_and_release_views(tmp_path):
    storage = LocalStorage(tmp_path / "idx")
    _publish_all(tmp_path, storage, ["cpu", "cu130"], nightly=True)
    page = storage.read("nightly/variants/vllm-engine/index.html").decode()
    assert f"../../../{C}/variants/vllm-engine/vllm_engine-0.1.dev5%2Bgabc1234" in page
    assert json.loads(storage.read("nightly/variants/metadata.json"))["commit"] == C

    rel = LocalStorage(tmp_path / "rel")
    for v, version in (("cpu", "1.2.3+cpu"), ("cu130", "1.2.3")):
        w = make_wheel(tmp_path / "rel-in" / v, version, commit=C, variant=v)
        publish(rel, C, [w], release=True, commit_time="100", log=lambda m: None)
    api = json.loads(rel.read("1.2.3/variants/vllm-engine/index.json"))
    assert api["versions"] == ["1.2.3"]
    assert {f["filename"] for f in api["files"]} == {
        "vllm_engine-1.2.3-cp38-abi3-manylinux_2_34_x86_64-null.whl",
        "vllm_engine-1.2.3-cp38-abi3-manylinux_2_34_x86_64-cu130.whl",
        "vllm_engine-1.2.3-variants.json"}
    assert verify(rel, log=lambda m: None) == []


def test_republishing_changes_nothing_and_verify_sees_a_stale_variants_json(tmp_path):
    storage = LocalStorage(tmp_path / "idx")
    _publish_all(tmp_path, storage, ["cpu"])
    w = _wheel(tmp_path, "cpu")
    res = publish(storage, C, [w], commit_time="100", log=lambda m: None)
    assert res.stored == [] and res.pages_written == []
    assert res.variants.stored == [] and res.variants.pages_written == []
    assert res.variants.unchanged == [
        f"vllm_engine-{DEV}-cp38-abi3-manylinux_2_34_x86_64-null.whl"]
    key = f"{C}/variants/vllm-engine/{variants_json_name(DEV)}"
    storage.write_atomic(key, b"{}")
    assert any("variants.json has sha256" in p for p in verify(storage, log=lambda m: None))


def test_only_unconvertible_variants_write_no_variants_level(tmp_path):
    storage = LocalStorage(tmp_path / "idx")
    said = []
    publish(storage, C, [_wheel(tmp_path, "rocm700")], commit_time="100", log=said.append)
    assert storage.read(f"{C}/variants/metadata.json") is None
    assert any("no variant wheel for rocm700" in m for m in said)


def test_is_variant_wheel_tells_the_two_names_apart(tmp_path):
    from wheel_index.variant_wheels import is_variant_wheel

    src = _wheel(tmp_path, "cpu")
    assert not is_variant_wheel(src.name)
    assert is_variant_wheel(make_variant_wheel(inspect_wheel(src), tmp_path).name)
    assert not is_variant_wheel("vllm_engine-1.0-1-cp38-abi3-linux_x86_64.whl")  # a build tag


@pytest.fixture
def two_variant_index(tmp_path):
    storage = LocalStorage(tmp_path / "idx")
    _publish_all(tmp_path, storage, ["cpu", "cu130"], nightly=True)
    return tmp_path / "idx"


@pytest.mark.parametrize("driver,variant", [(None, "cpu"), ("580.65.06", "cu130")])
@pytest.mark.parametrize("level", [f"{C}/variants", "nightly/variants"])
def test_precompiled_mode_picks_the_machines_variant_from_a_variants_level(
        two_variant_index, tmp_path, driver, variant, level):
    from tools.precompiled.select import choose_wheel

    root = tmp_path / "machine"
    if driver:
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/version").write_text(f"{driver}\n")
    root.mkdir(exist_ok=True)
    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": f"{two_variant_index}/{level}",
           "VLLM_DETECT_ROOT": str(root)}
    c = choose_wheel(tmp_path, env, log=lambda m: None)  # tmp_path: no git metadata needed
    assert c.variant == variant and c.commit == C
    assert c.filename == f"vllm_engine-{DEV}-cp38-abi3-manylinux_2_34_x86_64-" \
        f"{wheel_label(variant)}.whl"
    assert hashlib.sha256(Path(c.url).read_bytes()).hexdigest() == c.sha256


def test_precompiled_mode_refuses_a_variant_the_level_lacks(two_variant_index, tmp_path):
    from tools.errors import UserError
    from tools.precompiled.select import choose_wheel

    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": f"{two_variant_index}/{C}/variants",
           "VLLM_PRECOMPILED_WHEEL_VARIANT": "cu129"}
    with pytest.raises(UserError, match="no cu129 wheel"):
        choose_wheel(tmp_path, env, log=lambda m: None)


def test_bisect_reads_the_variants_level_when_the_variant_level_is_gone(two_variant_index):
    import shutil

    from tools.bisect import Installer

    inst = Installer.__new__(Installer)  # only the look-up; no environment is made
    inst.index, inst.variant = str(two_variant_index), "cpu"
    assert inst.wheel(C)[0].endswith(f"{C}/cpu/vllm-engine/vllm_engine-{DEV}.cpu-cp38-abi3-"
                                     "manylinux_2_34_x86_64.whl")
    shutil.rmtree(two_variant_index / C / "cpu")
    url, sha = inst.wheel(C)
    assert url.endswith(f"{C}/variants/vllm-engine/vllm_engine-{DEV}-cp38-abi3-"
                        "manylinux_2_34_x86_64-null.whl")
    assert hashlib.sha256(Path(url).read_bytes()).hexdigest() == sha


def test_bisect_installs_a_variant_wheel_with_uvs_preview_flag(two_variant_index, tmp_path):
    import shutil

    from tools.bisect import Installer

    shutil.rmtree(two_variant_index / C / "cpu")  # only the variants level has a cpu wheel
    (tmp_path / "work").mkdir()
    inst = Installer(tmp_path / "work", str(two_variant_index), "cpu", log=lambda m: None)
    res = inst.install(*inst.wheel(C))
    assert res.returncode == 0, res.stderr
    assert inst.run([str(inst.venv / "bin" / "python"), "-c",
                     "import engine, sys; sys.exit(engine.VARIANT != 'cpu')"]) == 0


def test_both_architectures_share_one_label(tmp_path):
    storage = LocalStorage(tmp_path / "idx")
    for plat in ("manylinux_2_34_x86_64", "manylinux_2_34_aarch64"):
        publish(storage, C, [_wheel(tmp_path / plat, "cpu", platform=plat)], commit_time="100",
                log=lambda m: None)
    level = json.loads(storage.read(f"{C}/variants/metadata.json"))
    assert sorted(w["platform_tag"] for w in level["wheels"]) == [
        "manylinux_2_34_aarch64", "manylinux_2_34_x86_64"]
    doc = json.loads(storage.read(f"{C}/variants/vllm-engine/{variants_json_name(DEV)}"))
    assert doc["variants"] == {"null": {}}


def test_variants_level_on_s3(s3_env, tmp_path):
    from wheel_index.storage import open_storage

    storage = open_storage(f"s3://{s3_env}/pre")
    _publish_all(tmp_path, storage, ["cpu", "cu130"], nightly=True)
    assert storage.read(f"{C}/variants/vllm-engine/") == storage.read(
        f"{C}/variants/vllm-engine/index.html")  # the folder key a bucket serves
    assert verify(storage, log=lambda m: None) == []


def test_precompiled_mode_refuses_a_commit_that_contradicts_the_level(two_variant_index,
                                                                      tmp_path):
    from tools.errors import UserError
    from tools.precompiled.select import choose_wheel

    env = {"VLLM_PRECOMPILED_WHEEL_INDEX": f"{two_variant_index}/{C}/variants",
           "VLLM_PRECOMPILED_WHEEL_VARIANT": "cpu", "VLLM_PRECOMPILED_WHEEL_COMMIT": "e" * 40}
    with pytest.raises(UserError, match="unset one"):
        choose_wheel(tmp_path, env, log=lambda m: None)
    for asked, level in ((C, f"{C}/variants"), ("nightly", "nightly/variants")):
        env.update(VLLM_PRECOMPILED_WHEEL_COMMIT=asked,
                   VLLM_PRECOMPILED_WHEEL_INDEX=f"{two_variant_index}/{level}")
        assert choose_wheel(tmp_path, env, log=lambda m: None).commit == C
