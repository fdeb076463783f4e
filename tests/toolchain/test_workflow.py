"""The release workflow, checked as a release engineer would: GitHub's schema,
zizmor's security audits, and the facts it must take from the variant table."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from helpers import REPO, dev_tool, run
from tools import variants

WORKFLOW = REPO / ".github" / "workflows" / "wheels.yml"



def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def _zizmor(path: Path, *extra: str):
    return run([dev_tool("zizmor"), "--offline", "--no-progress", "--format", "plain", *extra,
                path], check=False)


def test_workflow_is_valid_for_its_schema():
    res = run([dev_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
               WORKFLOW], check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_zizmor_finds_nothing():
    res = _zizmor(WORKFLOW)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No findings" in res.stdout + res.stderr


def test_zizmor_would_catch_a_regression(tmp_path):
    """The audit is live: the hazards the issue found are reported again."""
    text = WORKFLOW.read_text()
    bad = re.sub(r"actions/checkout@[0-9a-f]{40}", "actions/checkout@v4", text, count=1)
    bad = bad.replace("        with:\n          persist-credentials: false\n", "", 1)
    (tmp_path / "wheels.yml").write_text(bad)
    out = _zizmor(tmp_path / "wheels.yml")
    assert out.returncode != 0
    assert "unpinned-uses" in out.stdout and "artipacked" in out.stdout, out.stdout


def test_actions_pinned_by_commit_and_no_persisted_credentials():
    for name, job in _jobs().items():
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", step["uses"]), (name, step)
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, name


def test_only_publish_gets_credentials_and_it_restores_no_cache():
    text = WORKFLOW.read_text()
    assert "secrets." not in text  # OIDC, no static keys
    assert yaml.safe_load(text).get("permissions") == {}
    jobs = _jobs()
    for name, job in jobs.items():
        perms = job.get("permissions", {})
        uses = [s.get("uses", "") for s in job["steps"]]
        assert not any(u.startswith("actions/cache@") for u in uses), name
        if name == "publish":
            assert perms == {"contents": "read", "id-token": "write"}
            assert any(u.startswith("aws-actions/configure-aws-credentials@") for u in uses)
            assert any(u.startswith("actions/download-artifact@") for u in uses)
            assert "wheel" in job["needs"]
        else:
            assert perms == {"contents": "read"}, name
            assert not any("aws-actions" in u for u in uses), name


def test_matrix_comes_from_the_variant_table():
    wheel = _jobs()["wheel"]
    assert wheel["strategy"]["matrix"]["include"] == \
        "${{ fromJSON(needs.matrix.outputs.matrix).include }}"
    assert wheel["container"]["image"] == "${{ matrix.image }}"
    assert wheel["env"]["AUDITWHEEL_PLAT"] == "manylinux_2_28_${{ matrix.arch }}"
    out = run([sys.executable, "-m", "tools.variants", "--matrix"], cwd=REPO).stdout
    matrix = json.loads(out)
    assert matrix == variants.ci_matrix()
    built = {(r["variant"], r["arch"]) for r in matrix["include"]}
    assert {("cpu", "x86_64"), ("cpu", "aarch64"), ("cu130", "x86_64")} <= built
    unbuilt = {r["variant"]: r["reason"] for r in matrix["unbuilt"]}
    for label, v in variants.VARIANTS.items():
        if v.compiles and not v.kernels:
            assert label in unbuilt and "kernels" in unbuilt[label]
            assert label not in {b for b, _ in built}
    assert "rocm721" in unbuilt


def test_every_builder_image_is_manylinux_2_28_pinned_by_digest():
    rows = variants.ci_matrix()["include"]
    assert rows
    for row in rows:
        assert re.fullmatch(r"\S+@sha256:[0-9a-f]{64}", row["image"]), row
        assert re.search(r"manylinux_?2_28", row["image"]), row


def test_build_script_lists_variants_from_the_table():
    res = run(["bash", REPO / "ci" / "build-wheel.sh"], check=False,
              env={"PYTHON": sys.executable})
    assert res.returncode == 2
    listed = res.stderr.split("variants:")[1].split(")")[0].split()
    assert listed == [v.label for v in variants.VARIANTS.values() if v.kernels]


def test_build_script_refuses_a_variant_without_kernels(tmp_path):
    res = run(["bash", REPO / "ci" / "build-wheel.sh", "rocm721", tmp_path], check=False,
              env={"PYTHON": sys.executable})
    assert res.returncode == 2
    assert "rocm721" in res.stderr and "no HIP kernels" in res.stderr
    assert "Traceback" not in res.stderr
