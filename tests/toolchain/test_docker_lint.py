"""The image definitions without a Docker daemon: both Dockerfiles pass
hadolint (the CUDA one is only linted and built on its precompiled path here:
compiling its kernels takes longer than CI's budget on this machine), the
image workflow is schema-valid and clean under zizmor, ci/docker-build.sh
refuses bad input with one line."""
from __future__ import annotations

import re

import pytest

from helpers import REPO, dev_tool, run

DOCKERFILES = [REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.cpu"]
WORKFLOW = REPO / ".github" / "workflows" / "docker.yml"



def test_dockerfiles_pass_hadolint():
    res = run([dev_tool("hadolint"), "--config", REPO / "docker" / "hadolint.yaml", *DOCKERFILES],
              check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfiles_have_their_targets_and_build_args():
    cpu = DOCKERFILES[1].read_text()
    cuda = DOCKERFILES[0].read_text()
    for target in ("vllm-engine-openai", "vllm-engine-openai-zen"):
        assert re.search(rf"^FROM \S+ AS {target}$", cpu, re.M)
    assert re.search(r"^FROM \S+ AS vllm-engine-openai-cuda$", cuda, re.M)
    for arg in ("BASE_IMAGE", "PYTHON_VERSION", "VLLM_CPU_DISABLE_AVX512", "VLLM_CPU_AVX512BF16",
                "VLLM_CPU_AVX512VNNI", "VLLM_CPU_AMXBF16"):
        assert re.search(rf"^ARG {arg}\b", cpu, re.M), arg
    for arg in ("BASE_IMAGE", "PYTHON_VERSION", "max_jobs", "nvcc_threads", "torch_cuda_arch_list",
                "VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_COMMIT"):
        assert re.search(rf"^ARG {arg}\b", cuda, re.M), arg
    for text in (cpu, cuda):
        assert "HEALTHCHECK" in text and "/health" in text
        assert re.search(r'^ENTRYPOINT \["engine", "serve"', text, re.M)
        assert re.findall(r"^USER (\S+)$", text, re.M)[-1] not in ("0", "root")


def test_docker_workflow_is_schema_valid_and_clean_under_zizmor():
    res = run([dev_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", WORKFLOW],
              check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run([dev_tool("zizmor"), "--offline", WORKFLOW], check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    text = WORKFLOW.read_text()
    assert "ci/docker-build.sh vllm-engine-openai" in text
    assert "latest-$ARCH" in text and "-$ARCH\")" in text
    uses = re.findall(r"uses: (\S+)", text)
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses
    # Only the push job sees the registry token.
    build_job = text.split("\n  push:")[0]
    assert "secrets." not in build_job


@pytest.mark.parametrize("args, message", [
    ([], "usage: ci/docker-build.sh"),
    (["vllm-openai"], "error: unknown target 'vllm-openai'"),
    (["vllm-engine-openai", "--base"], "error: --base needs an image name"),
    (["vllm-engine-openai", "--bogus"], "error: unknown option '--bogus'"),
])
def test_docker_build_refuses_bad_input_with_one_line(args, message):
    res = run(["bash", REPO / "ci" / "docker-build.sh", *args], check=False, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), res.stderr
