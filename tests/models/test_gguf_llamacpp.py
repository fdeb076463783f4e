"""The same GGUF file in this engine and in llama.cpp (llama-cpp-python, where
it is installed): greedy ids equal where both multiply the weights as stored
(F32, F16 and BF16 files: 6 tokens), and the first token equal on the quantized types,
where both round the activations to 8 bits, each its own way (llama.cpp's Q8_K /
Q8_0 blocks, this engine's groups of the weight's block: gguf_int8), and
the random tiny model's near-ties then part. llama.cpp reading the K-quant blocks
tests/gguf_files.py packs also shows they are laid out as ggml's own."""
from __future__ import annotations

from unittest import mock

import pytest
from gguf_files import QUANT_SHAPE, write_gguf

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (CMAKE_ARGS=-DGGML_NATIVE=ON pip "
    "install llama-cpp-python: about 10 minutes of two cores)")

PROMPTS = ["Hello, how are", "The quick brown fox", "one two three four"]
NEW = 6  # random tiny models have near-ties; seen equal to 11 tokens on F32 (2-core Zen 4)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    from engine import tiny_model

    work = tmp_path_factory.mktemp("llamacpp")
    with mock.patch.dict("os.environ", {"VLLM_CACHE_ROOT": str(work / "cache")}), \
            mock.patch.dict(tiny_model.SHAPE, QUANT_SHAPE):
        yield tiny_model.make_tiny_model(work / "tiny")


def _ours(file, prompts):
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(model=str(file), dtype="float32", max_model_len=256, num_kv_blocks=16,
              block_size=32, bind_threads=False)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    return [o.prompt_token_ids for o in outs], [o.outputs[0].token_ids for o in outs]


def _theirs(file, prompt_ids):
    from llamacpp_compat import patch_defaults

    patch_defaults()  # where its AMX buffers crash, without them
    cpp = llama_cpp.Llama(model_path=str(file), n_ctx=256, n_threads=2, verbose=False)
    out = []
    for ids in prompt_ids:
        got = []
        for tok in cpp.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True):
            got.append(tok)
            if len(got) == NEW:
                break
        out.append(got)
    return out


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K",
                                   "Q6_K"])
def test_greedy_ids_as_llama_cpp(src, qtype, tmp_path):
    file = write_gguf(src, tmp_path / f"{qtype}.gguf", qtype)
    prompt_ids, ours = _ours(file, PROMPTS)
    theirs = _theirs(file, prompt_ids)
    if qtype in ("F32", "F16", "BF16"):
        assert ours == theirs
    else:
        assert [o[0] for o in ours] == [t[0] for t in theirs]
