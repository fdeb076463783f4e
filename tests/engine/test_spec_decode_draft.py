"""Speculative decoding with a draft model (engine/spec_decode/draft_model_proposer.py):
greedy ids equal to the target's alone whatever the draft proposes, nearly
every draft accepted when the draft is the target itself, few when it is
another model; a draft of another vocabulary refused in one line."""
from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from engine.spec_decode.config import SpeculativeConfig

ENGINE = dict(dtype="float32", block_size=32, num_kv_blocks=64, max_model_len=512,
              bind_threads=False)
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 10, 11, 12] * 5, [13, 14], list(range(20, 60))]


def test_a_model_makes_the_draft_model_method_as_upstream():
    c = SpeculativeConfig.parse('{"model": "/drafts/small", "num_speculative_tokens": 3}')
    assert (c.method, c.model, c.num_speculative_tokens) == ("draft_model", "/drafts/small", 3)
    assert SpeculativeConfig.parse({"method": "draft_model", "model": "d",
                                    "num_speculative_tokens": 2}).model == "d"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("draft")
    return {"target": make_tiny_model(root / "target"),
            "other": make_tiny_model(root / "other", seed=1),
            "other_vocab": make_tiny_model(root / "vocab", vocab_size=384)}


def _run(target, draft, k: int = 3):
    from engine.entrypoints.llm import LLM

    spec = None if draft is None else {"model": str(draft), "num_speculative_tokens": k}
    llm = LLM(target, speculative_config=spec, **ENGINE)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ids = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    stats = llm.core.scheduler.spec_stats
    return ids, (None if stats is None else (stats.num_draft_tokens, stats.num_accepted_tokens))


def test_greedy_ids_are_the_targets_whatever_the_draft(models):
    want, _ = _run(models["target"], None)
    same, (drafted, accepted) = _run(models["target"], models["target"])
    assert same == want
    assert drafted > 100 and accepted >= 0.9 * drafted, (drafted, accepted)
    other, (drafted, accepted) = _run(models["target"], models["other"])
    assert other == want
    assert drafted > 50 and accepted < 0.5 * drafted, (drafted, accepted)


def test_a_draft_of_another_vocabulary_is_one_line(models):
    from engine.entrypoints.llm import LLM

    with pytest.raises(ValueError) as e:
        LLM(models["target"], speculative_config={"model": str(models["other_vocab"]),
                                                  "num_speculative_tokens": 2}, **ENGINE)
    assert "vocabulary" in str(e.value) and "\n" not in str(e.value)
