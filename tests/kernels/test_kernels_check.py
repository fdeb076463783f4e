"""engine._kernels.check_torch: GPU kernels load only into the torch build they
were compiled against, release and local label (+cu129, +cu130) alike; CPU
kernels into any build of their release."""
from __future__ import annotations

import pytest

from engine._kernels import TorchMismatchError, check_torch
from engine.build_info import BuildInfo


def info(variant: str, torch_version: str, req: str, index: str | None) -> BuildInfo:
    return BuildInfo(variant=variant, device="cuda" if variant.startswith("cu") else "cpu",
                     git_commit="0" * 40, torch_version=torch_version, torch_requirement=req,
                     torch_index_url=index)


CU129 = info("cu129", "2.13.0+cu129", "torch==2.13.0+cu129", "https://example.invalid/cu129")


@pytest.mark.parametrize("installed", ["2.13.0+cpu", "2.13.0", "2.12.0+cu129"])
def test_other_build_of_torch_is_refused_naming_both_and_the_fix(installed):
    with pytest.raises(TorchMismatchError) as exc:
        check_torch(CU129, installed)
    msg = str(exc.value)
    assert "2.13.0+cu129" in msg and installed in msg
    assert "pip install 'torch==2.13.0+cu129' --index-url https://example.invalid/cu129" in msg


def test_same_build_loads():
    check_torch(CU129, "2.13.0+cu129")
    check_torch(info("cpu", "2.13.0+cpu", "torch==2.13.0+cpu", None), "2.13.0+cpu")
    check_torch(info("empty", None, None, None), "2.0.0")  # no kernels: nothing to compare


def test_cpu_kernels_need_the_release_not_the_build():
    cpu = info("cpu", "2.13.0+cu130", "torch==2.13.0+cpu", None)  # the cross-built aarch64 wheel
    check_torch(cpu, "2.13.0+cpu")
    with pytest.raises(TorchMismatchError):
        check_torch(cpu, "2.12.0+cpu")


def test_installed_torch_version_is_read_without_importing_torch(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    from engine import _kernels

    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "version.py").write_text("from typing import Optional\n\n__all__ = []\n"
                                    "__version__ = '2.13.0+cu129'\ncuda: Optional[str] = '12.9'\n")
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(pkg)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    assert _kernels.installed_torch_version() == "2.13.0+cu129"
    (pkg / "version.py").unlink()
    assert _kernels.installed_torch_version() is None  # then load() checks after importing torch
