"""The PEP 825 metadata the index publishes passes variantlib, the reference
implementation (pinned in requirements/dev.txt): every `*-variants.json` and
every variant wheel's `variant.json`, read as variantlib's own
`generate-index-json` reads them (the label from the file name, checked against
the one in variant.json). The cpu build has no properties, so it must be the
null variant, labelled `null`. That uv 0.13 still installs it, and picks it where
no CUDA driver is found: tests/toolchain/test_variant_wheels_e2e.py."""
from __future__ import annotations

import json
import zipfile

import pytest

from helpers import make_wheel
from wheel_index.publish import publish
from wheel_index.storage import LocalStorage

variantlib = pytest.importorskip(
    "variantlib", reason="variantlib is not installed: run ci/setup-dev.sh (requirements/dev.txt)")
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX  # noqa: E402
from variantlib.variant_dist_info import VariantDistInfo  # noqa: E402
from variantlib.variants_json import VariantsJson  # noqa: E402

C = "c" * 40
VARIANTS = ("cpu", "cu129", "cu130")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A commit's variants level with every variant that gets a variant wheel, each
    published by its own publisher, on two architectures for the cpu build."""
    tmp = tmp_path_factory.mktemp("variantlib")
    storage = LocalStorage(tmp / "idx")
    for v in VARIANTS:
        plats = ["manylinux_2_34_x86_64"] + (["manylinux_2_34_aarch64"] if v == "cpu" else [])
        for plat in plats:
            w = make_wheel(tmp / "in" / v / plat, f"0.1.dev5+gabc1234.{v}", commit=C,
                           platform=plat)
            publish(storage, C, [w], nightly=True, commit_time="100", log=lambda m: None)
    return tmp / "idx"


def _variant_json(wheel) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist()
                   if n.count("/") == 1 and n.endswith(".dist-info/variant.json")]
        return zf.read(name)


def test_every_variant_wheel_passes_variantlib(project):
    wheels = sorted((project / C / "variants" / "vllm-engine").glob("*.whl"))
    assert len(wheels) == 4
    labels = set()
    for wheel in wheels:
        m = VALIDATION_WHEEL_NAME_REGEX.fullmatch(wheel.name)
        assert m and m.group("variant_label"), wheel.name
        label = m.group("variant_label")
        info = VariantDistInfo(_variant_json(wheel), label)  # raises on anything it refuses
        assert info.variant_label == label
        assert info.variant_desc.is_null_variant() == (label == "null")
        labels.add(label)
    assert labels == {"null", "cu129", "cu130"}


def test_every_variants_json_passes_variantlib(project):
    # stored once, in the commit's level; nightly/variants links to it
    (doc,) = (project / C / "variants" / "vllm-engine").glob("*-variants.json")
    assert doc.name in (project / "nightly" / "variants" / "vllm-engine" / "index.html").read_text()
    published = VariantsJson(json.loads(doc.read_bytes()))  # raises on anything it refuses
    assert set(published.variants) == {"null", "cu129", "cu130"}
    # and it is what variantlib itself makes of the wheels (its generate-index-json)
    merged = None
    for wheel in sorted((project / C / "variants" / "vllm-engine").glob("*.whl")):
        label = VALIDATION_WHEEL_NAME_REGEX.fullmatch(wheel.name).group("variant_label")
        info = VariantDistInfo(_variant_json(wheel), label)
        if merged is None:
            merged = VariantsJson(info)
        merged.merge(info)
    assert merged.variants == published.variants
    assert merged.providers == published.providers
    assert merged.namespace_priorities == published.namespace_priorities
