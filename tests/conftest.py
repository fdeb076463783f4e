from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Engines commit their whole KV cache at start (as upstream's do); the tests' models
# are tiny, so a test's engine (and a server it starts) takes 1/32 of the 4 GiB default.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "0.125")

from helpers import REPO, UV, Server, build_torch_mirror, run, torch_wheelhouse  # noqa: E402


@pytest.fixture(scope="session")
def cpu_wheel(tmp_path_factory) -> Path:
    """The repaired cpu wheel, built once per test session by ci/build-wheel.sh
    (or taken from $VLLM_TEST_CPU_WHEEL when a caller has just built it)."""
    given = os.environ.get("VLLM_TEST_CPU_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheelhouse")
    run(["bash", REPO / "ci" / "build-wheel.sh", "cpu", out],
        env={"VLLM_TORCH_FIND_LINKS": str(torch_wheelhouse()), "PYTHON": sys.executable,
             "UV": UV}, cwd=REPO)
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="session")
def torch_mirror(tmp_path_factory):
    """A local mirror of PyTorch's index served on 127.0.0.1: the value tests
    give VLLM_TORCH_INDEX_BASE (PyTorch's own index is unreachable here)."""
    root = build_torch_mirror(tmp_path_factory.mktemp("torch-mirror"), torch_wheelhouse())
    server = Server(root)
    yield server.url
    server.close()


@pytest.fixture(scope="session")
def moto_server():
    from helpers import MotoServer

    server = MotoServer()
    yield server
    server.close()


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """AWS variables pointing boto3 at the loopback S3 server, and a fresh bucket."""
    import uuid

    import boto3

    for k, v in moto_server.env().items():
        monkeypatch.setenv(k, v)
    bucket = f"idx-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """A wheel index's storage: a folder, then a bucket on moto's S3 server."""
    from wheel_index.storage import open_storage

    if request.param == "local":
        return open_storage(str(tmp_path / "index"))
    return open_storage(f"s3://{request.getfixturevalue('s3_env')}/wheels")


# ChatML that shows the model its tools, and the calls and results of earlier turns
TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# a user's parser (--tool-parser-plugin): hermes under another name
TOOL_PLUGIN = """
from engine.entrypoints.openai.tool_parsers import ToolParserManager
from engine.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser


@ToolParserManager.register_module("my_hermes")
class MyHermes(Hermes2ProToolParser):
    pass
"""


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory):
    """One `engine serve` on a tiny random model for structured outputs and
    tool calling (tests/engine/test_structured_outputs.py, tests/entrypoints/test_tool_calls.py):
    xgrammar named, a chat template that renders tools, auto tool choice read
    by a plugin's parser."""
    from test_serve import ServerProcess

    from engine.tiny_model import make_tiny_model

    d = tmp_path_factory.mktemp("agents")
    model = make_tiny_model(d / "tiny")
    (d / "t.jinja").write_text(TOOLS_TEMPLATE)
    (d / "plugin.py").write_text(TOOL_PLUGIN)
    s = ServerProcess(model, "--served-model-name", "tiny", "--chat-template",
                      str(d / "t.jinja"), "--enable-auto-tool-choice", "--tool-call-parser",
                      "my_hermes", "--tool-parser-plugin", str(d / "plugin.py"),
                      "--structured-outputs-config", '{"backend": "xgrammar"}')
    yield s
    s.close()


@pytest.fixture(scope="session")
def vllm_compat_server(tmp_path_factory):
    """One `engine serve` of the tiny model (context 128, served as "tiny")
    shared by the vLLM-compatibility tests (issue 38: request fields,
    /metrics, the OpenAPI schema): one start-up instead of one per file."""
    from engine.cli import main
    from test_serve import ServerProcess

    model = tmp_path_factory.mktemp("models") / "tiny"
    assert main(["make-tiny-model", str(model)]) == 0
    server = ServerProcess(model, "--served-model-name", "tiny", "--max-model-len", "128")
    server.model = model
    yield server
    server.close()
