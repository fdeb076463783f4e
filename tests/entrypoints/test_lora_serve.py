"""Multi-LoRA served (issue 41): `engine serve --enable-lora` answering the
OpenAI SDK with `model=` an adapter's name, /v1/models listing the adapters,
adapters loaded and unloaded at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING),
and one-line 4xx answers for what cannot run."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from lora_adapters import make_adapter

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
pytest.importorskip("peft", reason="peft is a dev requirement (requirements/dev.txt)")
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")

pytestmark = pytest.mark.slow  # one server start (about 30 s on two cores)

PROMPT = "one two three four five"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server of the tiny base with adapters a1 (rank 8, --lora-modules
    name=path) and a2 (rank 4, the JSON form), runtime updates allowed; the
    merged checkpoints of a1..a3 beside it; and the too-large a4 (rank 32)."""
    from test_serve import ServerProcess

    from engine import LLM, SamplingParams
    from engine.tiny_model import make_tiny_model

    d = tmp_path_factory.mktemp("lora-serve")
    base = make_tiny_model(d / "base")
    for i, rank in ((1, 8), (2, 4), (3, 16)):
        make_adapter(base, d / f"a{i}", rank=rank, seed=i, merged=d / f"m{i}")
    make_adapter(base, d / "a4", rank=32, seed=4)
    refs = {}
    for name, path in (("tiny", base), ("a1", d / "m1"), ("a2", d / "m2"), ("a3", d / "m3")):
        llm = LLM(path, "float32", block_size=32, num_kv_blocks=16, max_model_len=128,
                  bind_threads=False)
        refs[name] = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12,
                                                           ignore_eos=True))[0].outputs[0].text
        del llm
    assert len(set(refs.values())) == 4
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "true"
    try:
        s = ServerProcess(base, "--served-model-name", "tiny", "--enable-lora",
                          "--max-loras", "2", "--max-cpu-loras", "2", "--max-lora-rank", "16",
                          "--lora-modules", f"a1={d / 'a1'}",
                          f'{{"name": "a2", "path": "{d / "a2"}"}}')
    finally:
        del os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
    s.dir, s.refs = d, refs
    yield s
    s.close()


def _client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)


def _complete(s, model: str) -> str:
    out = _client(s).completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                        temperature=0, extra_body={"ignore_eos": True})
    assert out.model == model
    return out.choices[0].text


def test_models_lists_the_adapters_with_their_parent(served):
    cards = {m.id: m for m in _client(served).models.list().data}
    assert {"tiny", "a1", "a2"} <= set(cards)
    assert cards["a1"].parent == "tiny" and cards["a1"].root == str(served.dir / "a1")
    assert cards["tiny"].parent is None


def test_concurrent_requests_of_adapters_and_base_equal_their_merged_models(served):
    models = ["a1", "tiny", "a2", "a1", "a2", "tiny"]
    with ThreadPoolExecutor(len(models)) as pool:
        texts = list(pool.map(lambda m: _complete(served, m), models))
    assert texts == [served.refs[m] for m in models]
    chat = _client(served).chat.completions.create(
        model="a2", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.model == "a2"


def test_unknown_adapter_is_a_404_naming_it(served):
    with pytest.raises(openai.NotFoundError) as e:
        _complete(served, "nope")
    assert "The model `nope` does not exist" in e.value.message
    assert "a1" in e.value.message


def test_load_and_unload_at_run_time(served):
    url = served.url + "/v1"
    r = httpx.post(url + "/load_lora_adapter",
                   json={"lora_name": "a3", "lora_path": str(served.dir / "a3")})
    assert r.status_code == 200 and "a3" in r.text, r.text
    assert "a3" in {m.id for m in _client(served).models.list().data}
    # three adapters served, two slots and two kept in memory: the LRU turns over
    assert [_complete(served, m) for m in ("a3", "a1", "a2", "a3")] == \
        [served.refs[m] for m in ("a3", "a1", "a2", "a3")]
    again = httpx.post(url + "/load_lora_adapter",
                       json={"lora_name": "a3", "lora_path": str(served.dir / "a3")})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    for body, needle in (({"lora_name": "big", "lora_path": str(served.dir / "a4")},
                          "rank 32 is larger than --max-lora-rank 16"),
                         ({"lora_name": "x", "lora_path": str(served.dir / "none")},
                          "is not a folder"),
                         ({"lora_name": "x", "lora_path": str(served.dir / "base")},
                          "no readable adapter_config.json")):
        bad = httpx.post(url + "/load_lora_adapter", json=body)
        msg = bad.json()["error"]["message"]
        assert bad.status_code == 400 and needle in msg and "\n" not in msg, msg
    # load_inplace: the name now serves other weights (a new id: the engine reads them)
    r = httpx.post(url + "/load_lora_adapter", json={
        "lora_name": "a3", "lora_path": str(served.dir / "a1"), "load_inplace": True})
    assert r.status_code == 200 and _complete(served, "a3") == served.refs["a1"]
    r = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "a3"})
    assert r.status_code == 200, r.text
    with pytest.raises(openai.NotFoundError):
        _complete(served, "a3")
    gone = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "a3"})
    assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]
