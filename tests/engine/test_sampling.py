"""The sampler's parameters against torch references computed from the same
logits (upstream vLLM's definitions), and SamplingParams' checks as upstream's."""
from __future__ import annotations

import pytest
import torch

from engine.model_executor.layers.sampler import process_logits, sample
from engine.sampling_params import SamplingParams

VOCAB = 50


class Seq:
    """What the sampler reads of a Sequence."""

    def __init__(self, prompt, output, params, seed=None):
        self.token_ids = list(prompt) + list(output)
        self.num_prompt_tokens = len(prompt)
        self.params = params
        self.logprobs = []
        self._g = None if seed is None else torch.Generator().manual_seed(seed)

    @property
    def num_output_tokens(self):
        return len(self.token_ids) - self.num_prompt_tokens

    def generator(self, device):
        return self._g


def _reference_penalties(row, prompt, output, p):
    """Upstream's apply_penalties, one row at a time, written out."""
    row = row.clone()
    seen = set(prompt) | set(output)
    for t in range(row.numel()):
        if t in seen:
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
        count = output.count(t)
        row[t] -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
    return row


def test_penalties_match_the_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=g) * 3
    cases = [([1, 2, 3], [4, 4, 5], dict(repetition_penalty=1.3)),
             ([7, 8], [8, 9, 9, 9], dict(frequency_penalty=0.7)),
             ([10], [11, 12, 11], dict(presence_penalty=-1.5, frequency_penalty=0.2,
                                      repetition_penalty=0.8)),
             ([1, 2], [3], {})]  # a plain row in the same batch stays as it was
    seqs = [Seq(pr, out, SamplingParams(**kw)) for pr, out, kw in cases]
    got = process_logits(logits, seqs)
    for i, (pr, out, _) in enumerate(cases):
        want = _reference_penalties(logits[i], pr, out, seqs[i].params)
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[3], logits[3])


def test_logit_bias_and_min_tokens():
    logits = torch.zeros(2, VOCAB)
    logits[:, 3] = 5.0  # the eos token would win
    seqs = [Seq([1], [], SamplingParams(temperature=0, logit_bias={7: 100.0})),
            Seq([1], [2], SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[4]))]
    got = process_logits(logits, seqs, eos_token_ids=(3,))
    assert got[0, 7] == 100.0 and got[0, 3] == 5.0
    assert got[1, 3] == float("-inf") and got[1, 4] == float("-inf")
    assert sample(logits, seqs, (3,)) == [7, int(torch.argmax(got[1]))]
    # once min_tokens are out, eos is allowed again
    done = Seq([1], [2, 2, 2], SamplingParams(temperature=0, min_tokens=3))
    assert sample(logits[:1], [done], (3,)) == [3]


def test_min_p_keeps_only_tokens_near_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04] + [1e-9] * (VOCAB - 5)]))
    drawn = {sample(logits, [Seq([1], [], SamplingParams(min_p=0.5), seed=s)], ())[0]
             for s in range(300)}
    assert drawn == {0, 1}  # 0.3 >= 0.5 * 0.5; 0.1 is not
    wide = {sample(logits, [Seq([1], [], SamplingParams(min_p=0.0), seed=s)], ())[0]
            for s in range(300)}
    assert len(wide) > 2


def test_logprobs_are_those_of_the_raw_logits():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, VOCAB, generator=g)
    seqs = [Seq([1], [], SamplingParams(temperature=0, logprobs=3, logit_bias={5: 3.0})),
            Seq([1], [], SamplingParams(temperature=1.0, logprobs=0, presence_penalty=1.0),
                seed=3),
            Seq([1], [], SamplingParams(temperature=0))]
    tokens = sample(logits, seqs, ())
    ref = torch.log_softmax(logits, -1)
    lp, top = seqs[0].logprobs[0]
    assert abs(lp - ref[0, tokens[0]].item()) < 1e-4
    want_v, want_i = ref[0].topk(3)
    assert [t for t, _ in top] == want_i.tolist()
    assert all(abs(v - w) < 1e-4 for (_, v), w in zip(top, want_v.tolist()))
    lp1, top1 = seqs[1].logprobs[0]
    assert abs(lp1 - ref[1, tokens[1]].item()) < 1e-4 and top1 == []
    assert seqs[2].logprobs == []


def test_greedy_with_penalties_takes_the_penalised_argmax():
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 3.0, 2.5
    s = Seq([1], [5, 5], SamplingParams(temperature=0, frequency_penalty=1.0))
    assert sample(logits, [s], ()) == [6]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_torch_argmax_ties_and_all(dtype):
    """A batch's greedy ids equal torch.argmax's: the first index of a tied maximum."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 4, (16, 4099), generator=g).to(dtype)  # many ties
    logits[5] = 1.0  # a row all tied
    logits[7, 4098] = 9.0  # the maximum at the last index
    seqs = [Seq([1], [], SamplingParams(temperature=0)) for _ in range(16)]
    assert sample(logits, seqs, ()) == torch.argmax(logits.float(), dim=-1).tolist()


def test_a_tiny_temperature_samples_finite_probabilities():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2)) * 30
    p = SamplingParams(temperature=1e-39)
    assert p.temperature == 0.01  # raised to upstream's minimum
    seqs = [Seq([1], [], p, seed=0), Seq([1], [], SamplingParams(temperature=0.01), seed=0)]
    a, b = sample(logits, seqs, ())
    assert 0 <= a < VOCAB and 0 <= b < VOCAB
    # upstream raises any positive temperature below 0.01 first: only 0 is greedy
    assert SamplingParams(temperature=5e-6).temperature == 0.01
    assert SamplingParams(temperature=0).greedy


def test_nan_logits_do_not_raise():
    logits = torch.full((1, VOCAB), float("nan"))
    (t,) = sample(logits, [Seq([1], [], SamplingParams(temperature=1.0), seed=0)], ())
    assert 0 <= t < VOCAB


@pytest.mark.parametrize("kw, needle", [
    (dict(temperature=2.5), "temperature must be in [0, 2]"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(presence_penalty=3), "presence_penalty must be in [-2, 2]"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty must be > 0"),
    (dict(seed=2**63), "seed must be in"),
    (dict(seed=-(2**63) - 1), "seed must be in"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens"),
    (dict(stop_token_ids=[-3]), "stop_token_ids"),
    (dict(stop=[""]), "stop must be non-empty"),
    (dict(logprobs=-1), "logprobs must be >= 0"),  # the bound: --max-logprobs
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
])
def test_bad_params_are_one_clear_error(kw, needle):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kw)
    assert needle in str(info.value)


def test_seeds_as_upstream():
    assert SamplingParams(seed=-1).seed is None  # upstream: -1 is unseeded
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(ValueError, match="stop_token_ids: token ids must be in"):
        SamplingParams(stop_token_ids=[10**12]).check_vocab(VOCAB)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={VOCAB: 1.0}).check_vocab(VOCAB)
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(4))

    def draws(seed):
        s = Seq([1], [], SamplingParams(seed=seed))
        s._g = torch.Generator().manual_seed(s.params.seed)
        return [sample(logits, [s], ())[0] for _ in range(12)]

    assert draws(2**63 - 1) == draws(2**63 - 1)
    assert draws(2**63 - 1) != draws(-(2**63)) and draws(2**63 - 1) != draws(0)
