"""The prompt's logprobs (vLLM's prompt_logprobs, and echo with logprobs on
/v1/completions) against transformers' log_softmax over the same model's
logits: in the engine over prefill chunks and beside a cached prefix, and
through the API in process (whole, streamed, the prompt scored alone)."""
from __future__ import annotations

import asyncio
import json

import pytest
from helpers import app_in_process

transformers = pytest.importorskip("transformers", reason="a dev requirement")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai (requirements/dev.txt)")

PROMPT = ("the a of to and in is it you that he was for on are with as his they be at one "
          "have this from or had by hot word but what some we can out other were all there")
K = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def reference(tiny):
    """ids, and per prompt token after the first: (logprob, rank, top-K ids, top-K values)."""
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float32)
    ids = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    out = []
    for p in range(len(ids) - 1):
        v = lp[p, ids[p + 1]]
        top = lp[p].topk(K)
        out.append((float(v), int((lp[p] > v).sum()) + 1, top.indices.tolist(),
                    top.values.tolist()))
    return ids, out


def _check(got, want):
    assert len(got) == len(want)
    for (lp, rank, top), (wlp, wrank, wids, wvals) in zip(got, want):
        assert lp == pytest.approx(wlp, abs=1e-4) and rank == wrank
        assert [t for t, _ in top] == wids
        assert [v for _, v in top] == pytest.approx(wvals, abs=1e-4)


def test_engine_scores_the_prompt_over_chunks_and_beside_the_prefix_cache(tiny, reference):
    from engine.core.engine_core import EngineCore
    from engine.core.messages import EngineCoreRequest
    from engine.sampling_params import SamplingParams

    ids, want = reference
    assert len(ids) > 40  # more than two chunks of 16
    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=32, max_model_len=256,
                      bind_threads=False, max_num_seqs=4, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=K)
    outputs: dict[str, list] = {}

    def run(*requests):
        for r in requests:
            core.add_request(r)
        seqs = [core.requests[r.request_id] for r in requests]
        while core.has_unfinished():
            for o in core.step().outputs:
                outputs.setdefault(o.request_id, []).append(o)
        return seqs

    # fills the prefix cache with the prompt's first block
    (plain,) = run(EngineCoreRequest("plain", ids, SamplingParams(temperature=0, max_tokens=2)))
    scored = run(*[EngineCoreRequest(f"s{i}", ids, params) for i in range(2)])
    for s in scored:  # the cached prefix is not used: its logits are needed
        _check(s.prompt_logprobs, want)
        assert s.output_token_ids == plain.output_token_ids
        # the front end hears of them once, with the first token
        first, *rest = outputs[s.request_id]
        _check(first.prompt_logprobs, want)
        assert all(o.prompt_logprobs is None for o in rest)
        assert [t for o in outputs[s.request_id] for t in o.new_token_ids] == \
            s.output_token_ids
    assert plain.prompt_logprobs == []
    assert all(o.prompt_logprobs is None for o in outputs["plain"])


def test_a_recomputed_sequence_scores_its_prompt_once():
    from engine.core.sequence import Sequence
    from engine.sampling_params import SamplingParams

    s = Sequence(list(range(10)), SamplingParams(prompt_logprobs=0))
    s.num_scheduled_tokens = 6
    assert s.prompt_logprob_positions == range(0, 6)
    s.prompt_logprobs = [(0.0, 1, [])] * 6
    s.num_scheduled_tokens = 10  # preempted and recomputed from its first token
    assert s.prompt_logprob_positions == range(6, 9)


def _post(app, llm, bodies):
    async def main():
        run = asyncio.ensure_future(llm.run())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t", timeout=120) as c:
            out = [await c.post(path, json=body) for path, body in bodies]
        llm.shutdown()
        await run
        return out

    return asyncio.run(main())


def _events(response) -> list[dict]:
    lines = [x[len("data: "):] for x in response.text.splitlines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_the_api_returns_the_prompts_logprobs(tiny, reference):
    ids, want = reference
    app, llm = app_in_process(tiny)
    base = {"prompt": PROMPT, "temperature": 0, "echo": True, "logprobs": K}
    full, streamed, scored, field, chat, bad_stream, bad_zero = [r for r in _post(app, llm, [
        ("/v1/completions", {**base, "max_tokens": 4}),
        ("/v1/completions", {**base, "max_tokens": 4, "stream": True}),
        ("/v1/completions", {**base, "max_tokens": 0}),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "the sea"}],
                                  "max_tokens": 2, "prompt_logprobs": 0}),
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}),
    ])]
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    for r in (full, scored, field, chat):
        assert r.status_code == 200, r.text
    choice = full.json()["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert lp["tokens"][:n] == [tok.decode([t]) for t in ids] and len(lp["tokens"]) == n + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:n] == pytest.approx([w[0] for w in want], abs=1e-4)
    for top, t, (wlp, _, wids, wvals) in zip(lp["top_logprobs"][1:n], ids[1:], want):
        texts = [tok.decode([i]) for i in [t, *wids]]  # keys are texts: skip ones two ids share
        expect = {x: v for i, x, v in zip(wids, texts[1:], wvals) if texts.count(x) == 1}
        assert len(top) >= len(expect) and len(top) <= K + 1
        assert {x: top[x] for x in expect} == pytest.approx(expect, abs=1e-4)
    assert lp["text_offset"][0] == 0
    assert choice["text"].startswith(PROMPT)
    assert [e["rank"] for e in filter(None, [
        {**d[str(t)]} if d else None for d, t in zip(choice["prompt_logprobs"], ids)])] == \
        [w[1] for w in want]

    # streamed: the same tokens and logprobs, the echo with the first tokens
    events = _events(streamed)
    got = {"tokens": [], "token_logprobs": [], "text": ""}
    for e in events:
        for c in e["choices"]:
            got["text"] += c["text"]
            if c["logprobs"]:
                got["tokens"] += c["logprobs"]["tokens"]
                got["token_logprobs"] += c["logprobs"]["token_logprobs"]
    assert got["text"] == choice["text"] and got["tokens"] == lp["tokens"]
    assert got["token_logprobs"][0] is None
    assert got["token_logprobs"][1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-5)

    # max_tokens 0: the prompt alone, scored (lm-eval-harness's loglikelihood call)
    only = scored.json()["choices"][0]
    assert only["text"] == PROMPT and len(only["logprobs"]["tokens"]) == n
    assert only["logprobs"]["token_logprobs"][1:] == pytest.approx(
        [w[0] for w in want], abs=1e-4)

    # vLLM's prompt_logprobs field: the prompt's token first, then the top ones
    pl = field.json()["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and len(pl) == n
    for entry, t, (wlp, wrank, wids, wvals) in zip(pl[1:], ids[1:], want):
        assert entry[str(t)]["logprob"] == pytest.approx(wlp, abs=1e-4)
        assert entry[str(t)]["rank"] == wrank
        assert entry[str(wids[0])]["rank"] in (1, wrank)
    assert field.json()["choices"][0]["logprobs"] is None
    assert chat.json()["prompt_logprobs"][0] is None and len(chat.json()["prompt_logprobs"]) > 3

    for r, param in ((bad_stream, "prompt_logprobs"), (bad_zero, "max_tokens")):
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
