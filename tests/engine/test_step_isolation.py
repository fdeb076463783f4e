"""A request that makes its step raise fails alone (issue 39): the engine core
runs the batch again a request at a time, the others get their tokens, equal
to a run without the failing one."""
from __future__ import annotations

import pytest

from engine.core.engine_core import EngineCore
from engine.core.messages import EngineCoreRequest
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def core(tiny) -> EngineCore:
    return EngineCore(tiny, "float32", block_size=32, num_kv_blocks=32, max_model_len=256,
                      enable_prefix_caching=False)


def run(c: EngineCore, prompts: dict[str, list[int]]):
    """(tokens per request, failed ids, failure lines) until every request ends."""
    for rid, ids in prompts.items():
        c.add_request(EngineCoreRequest(rid, ids, SamplingParams(temperature=0, max_tokens=6,
                                                                 ignore_eos=True)))
    got: dict[str, list[int]] = {rid: [] for rid in prompts}
    failed, lines = [], []
    while c.has_unfinished():
        out = c.step()
        for o in out.outputs:
            got[o.request_id] += o.new_token_ids
        failed += out.failed_request_ids
        lines += [out.failure] if out.failure else []
    return got, failed, lines


def poisoned(c: EngineCore, poison: str):
    real = c.executor.execute_model

    def execute(seqs, is_prefill):
        if any(s.request_id == poison for s in seqs):
            raise FloatingPointError("a kernel met a NaN")
        return real(seqs, is_prefill)

    c.executor.execute_model = execute


PROMPTS = {"a": [1, 5, 9, 13], "poison": [1, 7, 7, 7, 2], "b": [1, 30, 31]}


def test_the_failing_request_fails_alone_and_the_others_are_exact(tiny):
    want, _, _ = run(core(tiny), {k: v for k, v in PROMPTS.items() if k != "poison"})
    c = core(tiny)
    poisoned(c, "poison")
    got, failed, lines = run(c, PROMPTS)
    assert failed == ["poison"] and got["poison"] == []
    assert lines == ["FloatingPointError: a kernel met a NaN"]
    assert got["a"] == want["a"] and got["b"] == want["b"] and len(want["a"]) == 6
    assert "poison" not in c.requests and c.blocks.num_free == c.blocks.num_blocks


def test_a_step_every_request_fails_raises_as_before(tiny):
    c = core(tiny)
    real = c.executor.execute_model
    c.executor.execute_model = lambda seqs, p: (_ for _ in ()).throw(RuntimeError("down"))
    with pytest.raises(RuntimeError, match="down"):
        run(c, {"a": [1, 2, 3], "b": [1, 4, 5]})
    c.executor.execute_model = real


def test_offline_generate_names_the_failed_prompt(tiny):
    from engine import LLM

    llm = LLM(model=str(tiny), dtype="float32", max_model_len=256, num_kv_blocks=32,
              block_size=32)
    real = llm.core.executor.execute_model

    def execute(seqs, is_prefill):
        if any(s.request_id.endswith("-1") for s in seqs):
            raise FloatingPointError("NaN")
        return real(seqs, is_prefill)

    llm.core.executor.execute_model = execute
    with pytest.raises(RuntimeError, match="failed: FloatingPointError: NaN"):
        llm.generate(prompt_token_ids=[[1, 5], [1, 6], [1, 7]],
                     sampling_params=SamplingParams(temperature=0, max_tokens=3))
