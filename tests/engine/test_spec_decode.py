"""Speculative decoding with n-gram drafts (engine/spec_decode): the config's
checks, the proposer, the rejection sampler's exactness (a chi-square test
over fixed logits), and end to end through the offline LLM: greedy ids with
speculation equal to those without, where the drafts are mostly rejected
(a random tiny model) and where most are accepted (the same model with its
attention damped: a near-bigram model whose output repeats its context),
with the request features a step must keep (stop tokens, max_tokens, seeds,
n, requests that run unspeculated in the same batch)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sampling_params import SamplingParams
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram_proposer import find_draft
from engine.spec_decode.rejection_sampler import verify

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}
ENGINE = dict(dtype="float32", block_size=32, num_kv_blocks=64, max_model_len=1024,
              bind_threads=False)


# ---- the config -------------------------------------------------------------------

@pytest.mark.parametrize("given, named", [
    ('{"method": "ngram", ', "not valid JSON"),
    ('[1, 2]', "JSON object"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "'method'"),
    ({"num_speculative_tokens": 2}, "'method'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookup": 3}, "'lookup'"),
    ({"method": "ngram"}, "'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "'prompt_lookup_min'"),
    ({"method": "ngram", "model": "/some/draft", "num_speculative_tokens": 2}, "'model'"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "'model'"),
    ({"model": "/some/draft", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
     "'prompt_lookup_max'"),
    ({"model": "/some/draft"}, "'num_speculative_tokens'"),
])
def test_bad_config_is_one_line_naming_the_key(given, named):
    with pytest.raises(ValueError) as e:
        SpeculativeConfig.parse(given)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_config_defaults_as_upstream():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3,
                                 "prompt_lookup_max": 4})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)


def test_cli_refuses_a_bad_config_before_loading(capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "/nonexistent", "--speculative-config", '{"method": "medusa"}'])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--speculative-config" in err and "'method'" in err


# ---- the proposer -----------------------------------------------------------------

def test_find_draft_takes_the_longest_match_first():
    ctx = np.array([1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 4, 2, 3])
    # "2 3" first occurs at 1 (then 9 9 5), the 3-gram "4 2 3" nowhere earlier
    assert find_draft(ctx, 2, 3, 3) == [9, 9, 5]
    ctx = np.array([2, 3, 5, 5, 4, 2, 3, 7, 8, 0, 4, 2, 3])
    assert find_draft(ctx, 2, 3, 2) == [7, 8]  # "4 2 3" outranks the earlier "2 3"
    assert find_draft(ctx, 2, 2, 2) == [5, 5]  # "2 3" alone: its first occurrence
    assert find_draft(np.array([5, 6, 7]), 1, 3, 4) == []
    assert find_draft(np.array([5, 6, 5]), 1, 3, 4) == [6, 5]  # runs to the context's end


def test_find_draft_equals_a_brute_force_search():
    import random

    def reference(ctx, lo, hi, k):  # every n-gram, longest first, each window in order
        size = len(ctx)
        for n in range(min(hi, size - 1), lo - 1, -1):
            for i in range(size - n):
                if list(ctx[i:i + n]) == list(ctx[size - n:]):
                    return list(ctx[i + n:i + n + k])
        return []

    rng = random.Random(1)
    for _ in range(2000):
        ctx = np.array([rng.randrange(4) for _ in range(rng.randrange(1, 40))])
        lo = rng.randrange(1, 4)
        hi, k = rng.randrange(lo, 6), rng.randrange(1, 6)
        assert find_draft(ctx, lo, hi, k) == reference(ctx, lo, hi, k), (ctx.tolist(), lo, hi)


def test_proposer_extends_its_arrays_and_forgets_finished_requests():
    from engine.core.sequence import Sequence
    from engine.spec_decode.ngram_proposer import NgramProposer

    proposer = NgramProposer(SpeculativeConfig.parse(SPEC), max_model_len=2000)
    filler = list(range(100, 400))  # past the array's first size (256)
    a = Sequence([1, 2, 3, 4] + filler + [1], SamplingParams(max_tokens=1000))
    a.num_computed_tokens = len(a) - 1
    proposer.propose_for([a])
    assert a.spec_token_ids == [2, 3, 4, 100]
    a.token_ids += list(range(500, 1100)) + [2, 3, 9, 2]  # grown past it again
    a.num_computed_tokens = len(a) - 1
    proposer.propose_for([a])
    assert a.spec_token_ids == [3, 4, 100, 101]  # "9 2" nowhere earlier: "2" first
    proposer.propose_for([])
    assert proposer._tokens == {}


# ---- the rejection sampler --------------------------------------------------------

def test_greedy_accepts_while_the_argmax_is_the_draft():
    logits = torch.full((4, 6), -1.0)
    for row, best in enumerate([2, 4, 1, 5]):
        logits[row, best] = 1.0
    p = SamplingParams(temperature=0)
    assert verify(logits, [2, 4, 1], p, None) == (3, 5)  # all accepted: the bonus token
    assert verify(logits, [2, 3, 1], p, None) == (1, 4)  # the second is not the argmax
    assert verify(logits, [0, 4, 1], p, None) == (0, 2)


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_sampling_with_drafts_keeps_the_distribution():
    """Each emitted token, given the ones before it, follows the target
    distribution (temperature and top-k applied) whatever the drafts: one
    likely draft, one unlikely, one cut by top-k."""
    from engine.model_executor.layers.sampler import probabilities

    g = torch.Generator().manual_seed(0)
    vocab, trials = 6, 6000
    logits = torch.randn(4, vocab, generator=g) * 1.5
    params = SamplingParams(temperature=0.8, top_k=5)
    target = [probabilities(row, params).numpy().astype(np.float64) for row in logits]
    drafts = [int(np.argmax(target[0])), int(np.argmin(np.where(target[1] > 0, target[1], 9))),
              int(np.argmin(target[2]))]  # the last has probability 0 (top-k)
    counts = [np.zeros(vocab) for _ in range(4)]
    accepted = np.zeros(4)
    for _ in range(trials):
        n, token = verify(logits, drafts, params, g)
        out = drafts[:n] + [token]
        accepted[n] += 1
        for pos, t in enumerate(out):  # position pos's token, given drafts before it
            counts[pos][t] += 1
    assert accepted[0] > 0 and accepted[1] > 0 and accepted[2] > 0
    assert accepted[3] == 0  # the third draft is cut by top-k: never accepted
    # df = 4 nonzero-probability tokens less one; p = 0.001 is 16.3, the bound is looser
    for pos in range(3):
        stat = _chi_square(counts[pos], target[pos])
        assert stat < 25, f"position {pos}: chi-square {stat:.1f}, counts {counts[pos]}"


# ---- end to end (offline LLM) -----------------------------------------------------

def damp_attention(folder, factor: float = 0.02):
    """Scale a checkpoint's attention output projections (o_proj) by factor:
    the next token then depends mostly on the current one (attention still
    computed and felt), so greedy output falls into repeating what its
    context holds: the case where prompt-lookup drafts are accepted."""
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    for f in Path(folder).glob("*.safetensors"):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            if name.endswith("self_attn.o_proj.weight"):
                tensors[name] = (t * factor).contiguous()
        save_file(tensors, str(f), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(random tiny model, its attention damped)."""
    from engine.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("spec")
    return make_tiny_model(root / "random"), damp_attention(make_tiny_model(root / "damped"))


@pytest.fixture(scope="module")
def engines(models):
    """{(model, speculating): LLM} for both models."""
    from engine.entrypoints.llm import LLM

    return {(m, spec): LLM(m, speculative_config=SPEC if spec else None, **ENGINE)
            for m in models for spec in (False, True)}


def _ids(llm, prompts, **kw):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 64, "ignore_eos": True, **kw})
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _stats(llm):
    s = llm.core.scheduler.spec_stats
    return s.num_draft_tokens, s.num_accepted_tokens


def test_greedy_ids_unchanged_where_drafts_are_rejected(models, engines):
    model = models[0]
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6, 7, 5], [9, 10, 11, 12] * 6, [13, 14]]
    before = _stats(engines[model, True])
    got = _ids(engines[model, True], prompts)
    drafted, accepted = np.subtract(_stats(engines[model, True]), before)
    assert got == _ids(engines[model, False], prompts)
    assert drafted > 20 and accepted < drafted / 2, (drafted, accepted)


def test_greedy_ids_unchanged_where_drafts_are_accepted(models, engines):
    model = models[1]
    base, spec = engines[model, False], engines[model, True]
    text = _ids(base, [[5]], max_tokens=60)[0]
    prompt = [5] + text + [7, 8, 5]  # "repeat the text": it begins again
    before = _stats(spec)
    got = _ids(spec, [prompt, [9, 10]], max_tokens=80)
    drafted, accepted = np.subtract(_stats(spec), before)
    assert got == _ids(base, [prompt, [9, 10]], max_tokens=80)
    assert accepted > drafted / 4 and accepted < drafted, (drafted, accepted)


def test_stops_and_lengths_hold_inside_accepted_drafts(models, engines):
    """A stop token or max_tokens that falls among a step's accepted drafts
    ends the output there, as without speculation: every token of the
    output tried as the stop token, every length as max_tokens (one batch
    each)."""
    model = models[1]
    base, spec = engines[model, False], engines[model, True]
    prompt = [5] + _ids(base, [[5]], max_tokens=60)[0] + [7, 8, 5]
    full = _ids(base, [prompt], max_tokens=32)[0]
    for key, values in (("stop_token_ids", [[t] for t in dict.fromkeys(full)]),
                        ("max_tokens", range(1, 32))):
        params = [SamplingParams(temperature=0, ignore_eos=True, **{"max_tokens": 32, key: v})
                  for v in values]
        want = [o.outputs[0].token_ids for o in base.generate([prompt] * len(params), params)]
        got = [o.outputs[0].token_ids for o in spec.generate([prompt] * len(params), params)]
        assert got == want, key
    assert [len(w) for w in want] == list(range(1, 32))


def test_seeded_sampling_and_unspeculated_requests(models, engines):
    """Seeded sampling with drafts gives the same ids on each run and in a
    batch beside other seeds; requests the speculative path does
    not take (logprobs, penalties) run in the same batch, unspeculated, with
    the ids they have without speculation (greedy)."""
    model = models[1]
    base, spec = engines[model, False], engines[model, True]
    prompt = [5] + _ids(base, [[5]], max_tokens=40)[0] + [5]
    sampled = SamplingParams(temperature=0.7, top_p=0.95, seed=7, max_tokens=40,
                             ignore_eos=True)
    first = spec.generate([prompt], sampled)[0].outputs[0].token_ids
    assert spec.generate([prompt], sampled)[0].outputs[0].token_ids == first
    assert len(first) == 40
    seeds = [SamplingParams(temperature=1.0, seed=s, max_tokens=12, ignore_eos=True)
             for s in (1, 2, 1)]
    outs = [o.outputs[0].token_ids for o in spec.generate([prompt] * 3, seeds)]
    assert outs[0] == outs[2] and all(len(o) == 12 for o in outs)
    plain = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    special = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2),
               SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, prompt_logprobs=1),
               SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                              repetition_penalty=1.2)]
    for p in special:
        want = [o.outputs[0].token_ids for o in base.generate([prompt, prompt], [plain, p])]
        got = [o.outputs[0].token_ids for o in spec.generate([prompt, prompt], [plain, p])]
        assert got == want


def test_without_chunked_prefill_and_with_a_small_cache(models, engines):
    """A KV cache of 6 blocks of 32 for 4 requests of ~90 tokens, with and
    without chunked prefill: sequences are preempted and recomputed (no
    more often than without drafts), drafts are dropped where they would
    need a block a decode needs, and the greedy ids stay those of the
    plain engine."""
    from engine.entrypoints.llm import LLM

    model = models[1]
    base = engines[model, False]
    prompt = [5] + _ids(base, [[5]], max_tokens=40)[0] + [7, 8, 5]
    prompts = [prompt, prompt[3:], [9, 10] + prompt, prompt[:20]]
    tight = {**ENGINE, "num_kv_blocks": 6, "max_model_len": 192}
    for chunked in (False, True):
        plain = LLM(model, **tight, enable_chunked_prefill=chunked)
        small = LLM(model, speculative_config=SPEC, **tight, enable_chunked_prefill=chunked)
        assert _ids(small, prompts, max_tokens=48) == _ids(base, prompts, max_tokens=48)
        _ids(plain, prompts, max_tokens=48)
        assert 0 < small.core.scheduler.num_preemptions <= plain.core.scheduler.num_preemptions
        assert _stats(small)[1] > 0


def test_drafts_never_take_the_block_a_decode_needs():
    """Two decodes, one free block: the one with drafts would fill it and
    preempt the other (its next token starts a block); its drafts wait."""
    from engine.core.kv_cache_manager import BlockManager
    from engine.core.scheduler import Scheduler
    from engine.core.sequence import Sequence
    from engine.spec_decode.metrics import SpecDecodingStats

    sched = Scheduler(BlockManager(3, 16), max_num_seqs=4, max_num_batched_tokens=64,
                      enable_chunked_prefill=True)
    sched.spec_stats = SpecDecodingStats.for_tokens(4)
    a, b = (Sequence(list(range(3, 3 + n)), SamplingParams(max_tokens=99)) for n in (15, 16))
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    sched.update_from_output(out, [1] * len(out.sampled))
    assert sched.blocks.num_free == 1
    a.spec_token_ids = [7, 7, 7, 7]  # positions 15-19: a's second block
    out = sched.schedule()
    assert out.preempted_req_ids == [] and out.num_scheduled_tokens == {a.request_id: 1,
                                                                       b.request_id: 1}
    assert a.spec_token_ids == []


def test_acceptance_totals_reach_the_metrics_once():
    """The core's totals, summed over data-parallel replicas and sent step
    after step (msgpack), count once in the server's vllm:spec_decode_*."""
    import msgspec

    from engine.core.messages import SchedulerStats
    from engine.entrypoints.openai.metrics import Metrics
    from engine.spec_decode.metrics import SpecDecodingStats, summed

    a, b = SpecDecodingStats.for_tokens(3), SpecDecodingStats.for_tokens(3)
    a.observe(3, 2)
    b.observe(2, 0)
    m = Metrics("tiny")
    for _ in range(2):  # the same totals again: nothing new
        stats = SchedulerStats(spec_decoding=summed([a, None, b]))
        m.on_stats(msgspec.msgpack.decode(msgspec.msgpack.encode(stats), type=SchedulerStats))
    a.observe(3, 3)
    m.on_stats(SchedulerStats(spec_decoding=summed([a, b])))
    text = m.render().decode()
    tiny = 'engine="0",model_name="tiny"'  # upstream's labels (docs/metrics.md)
    for line in (f'vllm:spec_decode_num_drafts_total{{{tiny}}} 3.0',
                 f'vllm:spec_decode_num_draft_tokens_total{{{tiny}}} 8.0',
                 f'vllm:spec_decode_num_accepted_tokens_total{{{tiny}}} 5.0',
                 f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{tiny},'
                 'position="1"} 2.0',
                 f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{tiny},'
                 'position="2"} 1.0'):
        assert line in text, line
    assert summed([None, None]) is None
