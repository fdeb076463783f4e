"""scikit-build-core dynamic-metadata plugin: version and Requires-Dist.

The version gets the variant as a local segment (tools.version); the runtime
requirements are requirements/<variant>.txt (tools.requirements).
"""
from __future__ import annotations

from tools.build_plan import resolve
from tools.requirements import REPO_ROOT, runtime_requirements
from tools.variants import is_default_variant
from tools.version import scm_version, with_variant


def dynamic_metadata(field: str, settings: dict | None = None):
    s = resolve()
    label = s.variant.label
    if field == "version":
        return with_variant(scm_version(REPO_ROOT), label, is_default_variant(label))
    if field == "dependencies":
        return runtime_requirements(label)
    raise ValueError(f"tools.metadata_provider cannot provide {field!r}")


def get_requires_for_dynamic_metadata(settings: dict | None = None) -> list[str]:
    return ["setuptools-scm>=8", "packaging>=23"]
