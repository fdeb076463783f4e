"""A step that raises fails the requests it ran, never the engine core's loop."""
from __future__ import annotations

import asyncio

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny):
    """A step that raises (here: the prefill of one poisoned request) ends
    the requests of that step with the cause; a request already decoding in
    other steps, and every later one, are answered; the loop never dies."""
    from helpers import async_llm_in_process

    from engine.core.async_llm import RequestFailedError
    from engine.core.engine_core import EngineCore
    from engine.core.input_processor import load_tokenizer
    from engine.sampling_params import SamplingParams

    # without chunked prefill, the poisoned prompt's prefill is a step of its
    # own; with it, the decodes batched into that step would fail with it
    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False, enable_chunked_prefill=False)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    execute = core.executor.execute_model
    poison = load_tokenizer(core.path).encode("poison").ids  # the core sees token ids only
    assert poison != load_tokenizer(core.path).encode("one two").ids

    def breaks(seqs, is_prefill):
        if any(s.token_ids[:s.num_prompt_tokens] == poison for s in seqs):
            raise RuntimeError("kernel fault")
        return execute(seqs, is_prefill)

    core.executor.execute_model = breaks  # before the core's thread starts stepping
    llm = async_llm_in_process(tiny, core=core)

    async def read(prompt, delay=0.0):
        await asyncio.sleep(delay)
        ids = []
        try:
            async for u in llm.generate(await llm.make_request(prompt, params)):
                ids += u.new_token_ids
        except RequestFailedError as exc:
            return ids, str(exc)
        return ids, None

    async def main():
        run = asyncio.ensure_future(llm.run())
        got = await asyncio.wait_for(asyncio.gather(read("one two"), read("poison", 0.05)), 60)
        later = await asyncio.wait_for(read("three"), 60)
        llm.shutdown()
        await asyncio.wait_for(run, 30)
        return got, later

    (a, poisoned), later = asyncio.run(main())
    assert a == (a[0], None) and len(a[0]) == 30
    assert poisoned == ([], "the request failed in the engine: RuntimeError: kernel fault")
    assert len(later[0]) == 30 and later[1] is None
    assert llm.dead is None and llm.num_requests() == 0
    assert not core.requests and not core.has_unfinished()
    assert core.blocks.num_free == core.blocks.num_blocks
