"""Pooling models offline (engine.entrypoints.llm_pooling) against the
reference libraries on the same tiny checkpoints (`engine make-tiny-model`):
embeddings equal sentence-transformers' SentenceTransformer, rerank scores
its CrossEncoder's, in float32; the pooling routes' answers and refusals
through the server's app in this process (real servers: test_serve_pooling)."""
from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from helpers import app_in_process

st = pytest.importorskip("sentence_transformers",
                         reason="sentence-transformers is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx")

# of different lengths, but for "Sunday" and "Friday": one run of equal lengths in a batch
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, how are you today?",
         "Sunday", "What is the capital of France? Paris is the capital of France.",
         "Friday", "Tell me a story about a cat."]
QUERY = "Where does the fox live?"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from engine.tiny_pooling_model import make_tiny_pooling_model

    root = tmp_path_factory.mktemp("pool")
    made = {}

    def get(arch: str):
        if arch not in made:
            made[arch] = make_tiny_pooling_model(root / arch, arch=arch)
        return made[arch]
    return get


_engines: dict = {}


def llm(path, **kw):
    """One LLM per model and flags for the module (loading one takes seconds)."""
    from engine.entrypoints.llm import LLM

    key = (str(path), tuple(sorted(kw.items())))
    if key not in _engines:
        _engines[key] = LLM(path, dtype="float32", bind_threads=False, **kw)
    return _engines[key]


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("arch, runner", [("bert", "auto"), ("xlm-roberta", "auto"),
                                          ("qwen3-embedding", "pooling")])
def test_embeddings_equal_sentence_transformers(models, arch, runner):
    """Mean (BERT), [CLS] (XLM-R: positions past the padding id) and
    last-token (a Qwen3 decoder) pooling, normalized, in one mixed batch."""
    path = models(arch)
    want = st.SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    got = np.array([o.outputs.embedding for o in llm(path, runner=runner).embed(TEXTS)])
    assert got.shape == want.shape
    assert cosines(got, want).min() >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert-reranker", "xlm-roberta-reranker"])
def test_rerank_scores_equal_the_cross_encoder(models, arch):
    """BERT's pair reads token types (the second text is type 1); XLM-R's none."""
    path = models(arch)
    want = st.CrossEncoder(str(path), device="cpu").predict([(QUERY, t) for t in TEXTS])
    model = llm(path)
    got = [o.outputs.score for o in model.score(QUERY, TEXTS)]
    assert np.allclose(got, want, atol=1e-5), (got, want)
    # classify: the label's sigmoid over a text alone, as transformers computes it
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        want = torch.sigmoid(hf(**tok(TEXTS[:2], padding=True, return_tensors="pt")).logits)
    probs = [o.outputs.probs for o in model.classify(TEXTS[:2])]
    assert np.allclose(probs, want.numpy(), atol=1e-5)


def test_a_batch_equals_its_requests_one_at_a_time(models):
    """Varlen attention by length groups: every sequence attends to its own
    tokens only, whatever the batch packs beside it."""
    model = llm(models("bert"))
    lengths = [len(o.prompt_token_ids) for o in model.embed(TEXTS)]
    assert lengths[2] == lengths[4] and len(set(lengths)) == len(lengths) - 1
    together = np.array([o.outputs.embedding for o in model.embed(TEXTS)])
    alone = np.array([model.embed(t)[0].outputs.embedding for t in TEXTS])
    assert np.abs(together - alone).max() < 1e-5


def test_dimensions_and_normalize(models):
    from engine.pooling_params import PoolingParams

    model = llm(models("bert"))
    full = np.array(model.embed(TEXTS[0], PoolingParams(normalize=False))[0].outputs.embedding)
    short = np.array(model.embed(TEXTS[0], PoolingParams(dimensions=16))[0].outputs.embedding)
    assert short.shape == (16,)
    assert np.allclose(short, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    with pytest.raises(ValueError, match=r"dimensions must be an integer in \[1, 64\]"):
        model.embed(TEXTS[0], PoolingParams(dimensions=65))
    with pytest.raises(ValueError, match="classify: this model serves embed, score"):
        model.classify(TEXTS[0])


@pytest.mark.parametrize("arch, kw, needle", [
    ("bert", {"runner": "generate"}, "--runner generate: BertModel is an encoder"),
    ("bert", {"convert": "classify"}, "--convert classify: BertModel has no classification"),
    ("qwen3-embedding", {"convert": "score"}, "--convert score: Qwen3ForCausalLM has no"),
    ("bert", {"tensor_parallel_size": 2}, "--runner pooling runs on one rank"),
])
def test_flags_the_model_cannot_honour_are_one_line(models, arch, kw, needle):
    from engine.engine_args import create_engine_config

    with pytest.raises(ValueError) as e:
        create_engine_config(models(arch), "float32", **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_decoder_generates_unless_asked_to_pool(models):
    from engine.engine_args import create_engine_config

    assert create_engine_config(models("qwen3-embedding"), "float32",
                                num_kv_blocks=64).runner == "generate"
    c = create_engine_config(models("qwen3-embedding"), "float32", runner="pooling")
    assert (c.runner, c.num_blocks, c.pooler.pooling) == ("pooling", 0, "LAST")


# ---- the routes, through the app in this process ------------------------------------


def ask(path, requests: list[tuple[str, dict]], **engine_args) -> list:
    app, engine = app_in_process(path, **engine_args)

    async def main():
        run = asyncio.ensure_future(engine.run())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            got = [await c.post(route, json=body) for route, body in requests]
        engine.shutdown()
        await run
        return got

    return asyncio.run(main())


def test_routes_answer_as_the_offline_api(models):
    path = models("bert")
    want = np.array([o.outputs.embedding for o in llm(path).embed(TEXTS[:2])])
    floats, b64, pooled, score, rerank, bare = ask(path, [
        ("/v1/embeddings", {"input": TEXTS[:2]}),
        ("/v1/embeddings", {"input": TEXTS[:2], "encoding_format": "base64"}),
        ("/pooling", {"input": TEXTS[0]}),
        ("/score", {"text_1": TEXTS[0], "text_2": TEXTS[:2]}),
        ("/v1/rerank", {"query": TEXTS[1], "documents": TEXTS[:3], "top_n": 2}),
        ("/v1/embeddings", {"input": TEXTS[0], "add_special_tokens": False}),
    ])
    got = np.array([d["embedding"] for d in floats.json()["data"]])
    assert np.allclose(got, want, atol=1e-6)
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                        for d in b64.json()["data"]])
    assert np.array_equal(decoded, got.astype(np.float32))
    assert floats.json()["usage"]["prompt_tokens"] > 0
    assert np.allclose(pooled.json()["data"][0]["data"], want[0], atol=1e-6)
    assert np.allclose([d["score"] for d in score.json()["data"]], [1.0, want[0] @ want[1]],
                       atol=1e-5)
    results = rerank.json()["results"]
    assert [r["index"] for r in results][:1] == [1] and len(results) == 2
    assert results[0]["document"]["text"] == TEXTS[1]
    # without [CLS] and [SEP]: two tokens fewer, another vector
    assert bare.json()["usage"]["prompt_tokens"] == len(llm(path).embed(TEXTS[0])[0]
                                                        .prompt_token_ids) - 2
    assert not np.allclose(bare.json()["data"][0]["embedding"], want[0], atol=1e-3)


def test_bad_inputs_are_a_400_naming_the_field(models):
    """Counts and lengths refused before the engine runs anything."""
    got = ask(models("bert"), [
        ("/v1/embeddings", {"input": []}),
        ("/v1/embeddings", {"input": ["ok", "word " * 300]}),
        ("/v1/embeddings", {"input": ["a"] * 9}),
        ("/v1/embeddings", {"input": "a", "dimensions": 0}),
        ("/v1/embeddings", {"input": [[1, 2, 99999]]}),
        ("/v1/embeddings", {"input": "a", "encoding_format": "hex"}),
        ("/rerank", {"query": "q", "documents": []}),
        ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}),
        ("/classify", {"input": "a"}),
        ("/v1/completions", {"prompt": "a"}),
        ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 8}),
        ("/v1/embeddings", {"input": "still serving"}),
    ], max_waiting=8)
    *bad, last = got
    assert last.status_code == 200
    params = ["input", "input", "input", "dimensions", "input", "encoding_format",
              "documents", "text_2", None, None, "truncate_prompt_tokens"]
    for r, param in zip(bad, params):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and "\n" not in error["message"], error
    assert "input[1] has" in bad[1].json()["error"]["message"]
    assert "--max-waiting-queue-length" in bad[2].json()["error"]["message"]
    assert "this server runs a pooling model" in bad[9].json()["error"]["message"]


POOLING_ROUTES = {
    "/v1/embeddings": {"input": "hi", "encoding_format": "float", "dimensions": 8,
                       "normalize": True, "add_special_tokens": True, "model": "tiny"},
    "/pooling": {"input": ["hi", "there"]},
    "/classify": {"input": "hi"},
    "/score": {"text_1": "hi", "text_2": ["a", "b"]},
    "/v1/rerank": {"query": "hi", "documents": ["a", "b"], "top_n": 1,
                   "return_documents": False},
}


def test_hostile_values_in_every_field_get_no_5xx(models):
    """benchmarks/hostile.py's wrong values in each field of each pooling route
    (a cross-encoder serves all five but /v1/embeddings' and /pooling's 400)."""
    from benchmarks.hostile import BAD_VALUES

    requests = [(route, {**body, field: bad}) for route, body in POOLING_ROUTES.items()
                for field in body for bad in BAD_VALUES]
    got = ask(models("bert-reranker"), requests + [("/v1/rerank", POOLING_ROUTES["/v1/rerank"])])
    statuses = {r.status_code for r in got}
    assert max(statuses) < 500, [(q, r.text) for q, r in zip(requests, got)
                                 if r.status_code >= 500][:3]
    assert got[-1].status_code == 200 and got[-1].json()["results"][0]["index"] in (0, 1)
    assert all(r.status_code in (400, 404) and "\n" not in r.json()["error"]["message"]
               for r in got if r.status_code != 200)  # 404: a "model" that is not served


def test_a_generative_server_refuses_the_pooling_routes(tmp_path):
    from engine.tiny_model import make_tiny_model

    got = ask(make_tiny_model(tmp_path / "llama"), [(route, body) for route, body in
                                                    POOLING_ROUTES.items()])
    for r in got:
        assert r.status_code == 400
        assert "this server runs a generative model" in r.json()["error"]["message"]


def test_bfloat16_embeddings_stay_close_to_float32(models):
    """The engine's bfloat16 kernels under the encoder; pooled in float32."""
    from engine.entrypoints.llm import LLM

    path = models("bert")
    want = np.array([o.outputs.embedding for o in llm(path).embed(TEXTS)])
    half = LLM(path, dtype="bfloat16", bind_threads=False)
    got = np.array([o.outputs.embedding for o in half.embed(TEXTS)])
    assert cosines(got, want).min() >= 0.999
