"""Chunked prefill and prefix caching change when and what is computed, never
the tokens: greedy ids equal transformers' with each on and off, for a prompt
longer than the step's budget, prompts sharing a prefix, a prefix found again
by a later generate() call, and under preemption."""
from __future__ import annotations

import random

import pytest
from helpers import make_checkpoint
from test_engine import hf_greedy

from engine.core.messages import EngineCoreRequest
from engine.entrypoints.llm import LLM
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("models") / "llama", "llama", seed=3)


@pytest.fixture(scope="module")
def prompts():
    r = random.Random(1)
    words = lambda n: [r.randrange(3, 100) for _ in range(n)]  # noqa: E731
    prefix = words(75)  # two full blocks of 32 and a part
    return [prefix + words(9), prefix + words(40), prefix[:70], words(150), words(3)]


@pytest.fixture(scope="module")
def expected(model, prompts):
    return [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]


def make(model, chunked: bool, cached: bool, **kw) -> LLM:
    if chunked:
        kw.setdefault("max_num_batched_tokens", 48)  # the 150-token prompt takes 4 steps
    return LLM(model=model, dtype="float32", bind_threads=False, block_size=32,
               num_kv_blocks=kw.pop("num_kv_blocks", 64), max_num_seqs=8,
               enable_chunked_prefill=chunked, enable_prefix_caching=cached, **kw)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
@pytest.mark.parametrize("cached", [True, False], ids=["prefix-cache", "no-cache"])
def test_greedy_ids_match_transformers(model, prompts, expected, chunked, cached):
    llm = make(model, chunked, cached)
    for _ in range(2):  # the second call finds every prompt's full blocks cached
        outs = llm.generate(prompts, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == expected
    b = llm.core.blocks
    if cached:
        # the second call finds every full block but each prompt's last:
        # 2 + 3 + 2 + 4 blocks of 32 (the first call too, when chunks let it)
        assert b.prefix_hits >= (2 + 3 + 2 + 4) * 32
    else:
        assert b.prefix_hits == 0 and not b.cached
    assert b.num_free == b.num_blocks and sum(b.ref) == 0  # every reference given back


def test_prefix_hit_across_calls_skips_the_prefix(model, prompts, expected):
    llm = make(model, True, True)
    llm.generate(prompts[:1], GREEDY)
    computed = []
    seqs_run = llm.core.scheduler.schedule  # record what the second call's first step runs

    def spy():
        out = seqs_run()
        computed.extend((s.num_computed_tokens, s.num_scheduled_tokens) for s in out.scheduled)
        return out

    llm.core.scheduler.schedule = spy
    (out,) = llm.generate(prompts[1:2], GREEDY)
    assert out.outputs[0].token_ids == expected[1]
    assert computed[0] == (64, 48)  # past the two cached blocks, a budget-sized chunk


def test_greedy_ids_match_transformers_under_preemption(model, prompts, expected):
    # 6 blocks of 32 tokens for 5 sequences, one of them 5 blocks long
    llm = make(model, True, True, num_kv_blocks=6, max_model_len=192)
    outs = llm.generate(prompts, GREEDY)
    assert llm.core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == expected
    b = llm.core.blocks
    assert b.num_free == b.num_blocks and sum(b.ref) == 0


def test_an_aborted_request_gives_its_blocks_back(model, prompts):
    llm = make(model, True, True)
    core = llm.core
    core.add_request(EngineCoreRequest("a", prompts[3], GREEDY))
    seq = core.requests["a"]
    assert core.step().outputs == []  # a first chunk: blocks held, no token yet
    assert seq.num_computed_tokens == 48 and seq.num_output_tokens == 0
    assert core.blocks.num_free < core.blocks.num_blocks
    core.abort_requests(["a"])
    assert "a" not in core.requests and not core.has_unfinished()
    assert core.blocks.num_free == core.blocks.num_blocks and sum(core.blocks.ref) == 0


def test_a_part_of_a_block_is_copied_not_recomputed(model):
    """A prompt sharing 26 tokens of another's third block (of 32) starts past
    the 16 of them that make a whole part, copied from that block: its greedy
    ids are transformers' own, also when both prompts run in one call."""
    r = random.Random(5)
    system = [r.randrange(3, 100) for _ in range(90)]
    first, second = system + [7, 8, 9], system + [r.randrange(3, 100) for _ in range(20)]
    want = [hf_greedy(model, p, GREEDY.max_tokens) for p in (first, second)]
    llm = make(model, True, True)
    assert llm.generate([first], GREEDY)[0].outputs[0].token_ids == want[0]
    computed, copies = [], []
    schedule, execute = llm.core.scheduler.schedule, llm.core.executor.execute_model

    def spy():
        out = schedule()
        computed.extend(s.num_computed_tokens for s in out.scheduled
                        if s.num_scheduled_tokens > 1)
        copies.extend(s.kv_copy for s in out.scheduled if s.kv_copy)
        return out

    llm.core.scheduler.schedule = spy
    (out,) = llm.generate([second], GREEDY)
    assert out.outputs[0].token_ids == want[1]
    assert computed[0] == 80 and len(copies) == 1 and copies[0][2] == 16
    b = llm.core.blocks
    assert not b.pinned and b.num_free == b.num_blocks and sum(b.ref) == 0
    outs = llm.generate([first, second], GREEDY)  # the first's own blocks are cached now
    assert [o.outputs[0].token_ids for o in outs] == want
