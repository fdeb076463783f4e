"""`engine serve m.gguf`: a real server on a GGUF file (its config, tokenizer and
chat template read from it) answers the real `openai` client with the offline
greedy ids of the same file; a malformed file stops `engine serve` with one
line naming it, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import pytest
from gguf_files import write_gguf
from helpers import REPO
from test_serve import BLOCK, MAX_MODEL_LEN, ServerProcess

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
pytest.importorskip("gguf", reason="gguf is a runtime requirement (requirements/common.txt)")

pytestmark = pytest.mark.slow  # a server process


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    from engine import tiny_model

    work = tmp_path_factory.mktemp("gguf-serve")
    with mock.patch.dict("os.environ", {"VLLM_CACHE_ROOT": str(work / "cache")}):
        src = tiny_model.make_tiny_model(work / "tiny")
        # the tiny model's 64 x 176 weights: Q8_0 rows of 64, F16 where 176 is no 32s
        types = {f"blk.{i}.ffn_down.weight": "F16" for i in range(2)}
        yield write_gguf(src, work / "tiny-q8_0.gguf", "Q8_0", types=types)


def test_serve_gguf_answers_as_offline(q8_file):
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    prompt = "Hello, how are you today?"
    offline = LLM(model=str(q8_file), dtype="float32", block_size=BLOCK, num_kv_blocks=128,
                  max_model_len=MAX_MODEL_LEN, bind_threads=False)
    want = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=16,
                                                     ignore_eos=True))[0].outputs[0].text
    server = ServerProcess(q8_file)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [str(q8_file)]
        got = client.completions.create(model=str(q8_file), prompt=prompt, max_tokens=16,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert got.choices[0].text == want
        chat = client.chat.completions.create(  # the file's chat template
            model=str(q8_file), messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert chat.usage.prompt_tokens > 3
    finally:
        server.close()


def test_serve_malformed_gguf_is_one_line(q8_file, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(q8_file.read_bytes()[:-1000])
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "serve", str(bad), "--port", "0"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "VLLM_CACHE_ROOT": str(tmp_path / "cache")})
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {bad}: not a valid GGUF file: tensor ")
    assert lines[0].endswith(f"runs past the end of the file ({bad.stat().st_size} bytes): the "
                             "file is truncated or its offsets are wrong")
