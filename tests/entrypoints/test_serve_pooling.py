"""`engine serve` of pooling models with the clients people point at it: the
OpenAI SDK's embeddings.create (its default base64, and float) and
langchain-openai's OpenAIEmbeddings, whose vectors equal
sentence-transformers' on the same checkpoint; /rerank and /v1/rerank
(Jina/Cohere shape) equal its CrossEncoder's scores. Real server processes
on 127.0.0.1 (tests/entrypoints/test_serve.py's)."""
from __future__ import annotations

import numpy as np
import pytest
from test_pooling import QUERY, TEXTS, cosines
from test_serve import ServerProcess

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")
st = pytest.importorskip("sentence_transformers", reason="a dev requirement (requirements/dev.txt)")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from engine.tiny_pooling_model import make_tiny_pooling_model

    root = tmp_path_factory.mktemp("served-pool")
    return lambda arch: make_tiny_pooling_model(root / arch, arch=arch)


def test_openai_sdk_and_langchain_embeddings(made):
    """(the decoder embedding model's vectors are checked offline: test_pooling)"""
    path = made("bert")
    want = st.SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    server = ServerProcess(path, "--served-model-name", "emb")
    try:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        for fmt in ({}, {"encoding_format": "float"}):  # the SDK asks for base64 by default
            got = c.embeddings.create(model="emb", input=TEXTS, **fmt)
            assert cosines([d.embedding for d in got.data], want).min() >= 0.9999
        short = c.embeddings.create(model="emb", input=TEXTS[0], dimensions=16).data[0].embedding
        assert len(short) == 16 and abs(np.linalg.norm(short) - 1) < 1e-5
        lc = pytest.importorskip("langchain_openai", reason="a dev requirement")
        # check_embedding_ctx_length=False: send text, not OpenAI's tiktoken ids
        emb = lc.OpenAIEmbeddings(base_url=server.url + "/v1", api_key="none", model="emb",
                                  check_embedding_ctx_length=False, max_retries=0)
        assert cosines(emb.embed_documents(TEXTS), want).min() >= 0.9999
        assert cosines([emb.embed_query(TEXTS[2])], want[2:3]).min() >= 0.9999
    finally:
        server.close()


def test_rerank_and_score_equal_the_cross_encoder(made):
    path = made("bert-reranker")
    want = st.CrossEncoder(str(path), device="cpu").predict([(QUERY, t) for t in TEXTS])
    server = ServerProcess(path, "--served-model-name", "rr")
    try:
        for route in ("/rerank", "/v1/rerank"):
            r = httpx.post(server.url + route, json={"model": "rr", "query": QUERY,
                                                     "documents": TEXTS, "top_n": 3}, timeout=60)
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            assert [x["index"] for x in results] == list(np.argsort(-want)[:3])
            assert np.allclose([x["relevance_score"] for x in results],
                               np.sort(want)[::-1][:3], atol=1e-5)
            assert results[0]["document"]["text"] == TEXTS[results[0]["index"]]
        r = httpx.post(server.url + "/score", json={"text_1": QUERY, "text_2": TEXTS}, timeout=60)
        assert np.allclose([d["score"] for d in r.json()["data"]], want, atol=1e-5)
        r = httpx.post(server.url + "/v1/embeddings", json={"input": "a"}, timeout=60)
        assert r.status_code == 400 and "serves classify, score" in r.json()["error"]["message"]
    finally:
        server.close()
