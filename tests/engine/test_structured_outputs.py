"""Structured outputs on xgrammar: the tiny model's random weights make each
answer a test of the grammar, not of the model. Served tests use the real
`openai` SDK against `engine serve`; the core's compile and the sampler's mask
are tested in process."""
from __future__ import annotations

import json
import re
from typing import Literal

import pytest
from test_serve import client, tiny_model  # noqa: F401

openai = pytest.importorskip("openai", reason="openai is a dev requirement (requirements/dev.txt)")
pytest.importorskip("xgrammar", reason="a runtime requirement (requirements/common.txt)")
from pydantic import BaseModel, Field  # noqa: E402

CHAT = [{"role": "user", "content": "Tell me about a person."}]
SAMPLED = {"temperature": 1.0, "seed": 7}


class Person(BaseModel):
    name: str = Field(pattern=r"^[a-z]{1,8}$")
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad", "calm"]
    tags: list[Literal["x", "y"]] = Field(max_length=3)


@pytest.fixture
def server(agent_server):  # one server with tests/entrypoints/test_tool_calls.py (conftest)
    return agent_server


@pytest.mark.slow
def test_parse_with_a_pydantic_model_100_of_100(server):
    c = client(server)
    r = c.chat.completions.parse(model="tiny", messages=CHAT, response_format=Person, n=100,
                                 max_tokens=300, **SAMPLED)
    assert len(r.choices) == 100
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Person)


@pytest.mark.slow
def test_regex_choice_grammar_100_of_100(server):
    c = client(server)
    regex = r"[0-9]{3}-[a-z]{2,5}(\.[A-Z])?"
    r = c.completions.create(model="tiny", prompt="one two", n=100, max_tokens=40,
                             extra_body={"structured_outputs": {"regex": regex}}, **SAMPLED)
    assert all(re.fullmatch(regex, ch.text) and ch.finish_reason == "stop" for ch in r.choices)
    colors = ["red", "green", "dark blue"]
    r = c.chat.completions.create(model="tiny", messages=CHAT, n=100, max_tokens=10,
                                  extra_body={"guided_choice": colors}, **SAMPLED)
    got = [ch.message.content for ch in r.choices]
    assert set(got) <= set(colors) and len(set(got)) > 1, got
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
    r = c.completions.create(model="tiny", prompt="sum:", n=100, max_tokens=60,
                             extra_body={"structured_outputs": {"grammar": grammar}}, **SAMPLED)
    stopped = [ch.text for ch in r.choices if ch.finish_reason == "stop"]
    assert len(stopped) >= 90 and all(re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", t)
                                      for t in stopped), stopped


@pytest.mark.slow
def test_json_object_schema_fields_and_streaming(server):
    c = client(server)
    r = c.chat.completions.create(model="tiny", messages=CHAT, n=20, max_tokens=300,
                                  response_format={"type": "json_object"}, **SAMPLED)
    done = [ch.message.content for ch in r.choices if ch.finish_reason == "stop"]
    assert done and all(isinstance(json.loads(t, strict=False), (dict, list)) for t in done)
    schema = Person.model_json_schema()
    r = c.completions.create(model="tiny", prompt="x", max_tokens=300, n=10,
                             extra_body={"guided_json": json.dumps(schema)}, **SAMPLED)
    for ch in r.choices:
        Person.model_validate_json(ch.text)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=300, stream=True, **SAMPLED,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "p", "schema": schema, "strict": True}}))
    Person.model_validate_json(text)
    # the Responses API's text.format
    resp = c.responses.create(model="tiny", input="a person", max_output_tokens=300,
                              temperature=1.0, text={"format": {
                                  "type": "json_schema", "name": "p", "schema": schema}})
    Person.model_validate_json(resp.output_text)
    tag = {"type": "structural_tag", "triggers": ["<f>"], "structures": [
        {"begin": "<f>", "schema": {"type": "object", "properties": {"a": {"enum": [1, 2]}},
                                    "required": ["a"], "additionalProperties": False},
         "end": "</f>"}]}
    r = c.completions.create(model="tiny", prompt="<f>", max_tokens=30, n=5,
                             extra_body={"response_format": tag}, **SAMPLED)
    assert all(ch.text for ch in r.choices)


@pytest.mark.slow
@pytest.mark.parametrize("extra,field,needle", [
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs", "regex is not valid"),
    ({"structured_outputs": {"json": "{bad"}}, "structured_outputs", "not valid JSON"),
    ({"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs", "foo"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one"),
    ({"structured_outputs": {"regex": "a", "backend": "outlines"}}, "structured_outputs",
     "outlines"),
    ({"guided_choice": []}, "guided_choice", "list of strings"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs",
     "whitespace_pattern"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
     "response_format", "nope"),
    ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex", "both"),
    ({"guided_json": '{"type":"object","properties":{"a":' * 80 + '{}' + '}}' * 80},
     "guided_json", "nests deeper"),
])
def test_bad_constraints_are_400s_naming_the_field(server, extra, field, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model="tiny", prompt="x", max_tokens=4,
                                          extra_body=extra)
    assert e.value.body["param"] == field and needle in e.value.body["message"], e.value.body
    assert "\n" not in e.value.body["message"]


def test_an_unknown_backend_is_refused_by_name(tiny_model, capsys):  # noqa: F811
    from engine.cli import main

    assert main(["serve", str(tiny_model), "--port", "1", "--structured-outputs-config",
                 '{"backend": "outlines"}']) == 2  # before binding, before the model loads
    assert "backend 'outlines' is not available" in capsys.readouterr().err


def test_a_slow_build_is_a_400_in_time(monkeypatch):
    import asyncio

    from engine.entrypoints.openai import structured_outputs as so
    from engine.sampling_params import StructuredOutputsParams

    monkeypatch.setenv("VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S", "0.05")
    # 240 kB: ~4 s to build on a quiet core (80 kB took 0.054 s: no margin over the limit)
    slow = StructuredOutputsParams(regex="(a|b|c|d|e|f|g)*" * 15000)
    with pytest.raises(so.StructuredOutputError, match="took more than 0.05 s"):
        asyncio.run(so.check(slow, "response_format"))


def test_core_compiles_off_the_step_and_fails_a_slow_grammar_alone(tiny_model,  # noqa: F811
                                                                  monkeypatch):
    from engine.core.engine_core import EngineCore
    from engine.core.messages import EngineCoreRequest
    from engine.sampling_params import SamplingParams, StructuredOutputsParams

    monkeypatch.setenv("VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S", "0.2")
    core = EngineCore(tiny_model, "float32", block_size=32, num_kv_blocks=16,
                      max_model_len=256, bind_threads=False)
    slow = StructuredOutputsParams(regex="(a|b|c|d|e|f|g)*" * 500)  # seconds to compile
    ok = StructuredOutputsParams(regex="[0-9]{4}")
    core.add_request(EngineCoreRequest("slow", [0, 5, 6], SamplingParams(structured_outputs=slow)))
    core.add_request(EngineCoreRequest("ok", [0, 5, 6], SamplingParams(
        temperature=1.0, seed=1, max_tokens=20, structured_outputs=ok)))
    core.add_request(EngineCoreRequest("plain", [0, 5, 6], SamplingParams(max_tokens=3,
                                                                          ignore_eos=True)))
    tokens, failed = {}, {}
    while core.has_unfinished():
        out = core.step()
        for rid in out.failed_request_ids:
            failed[rid] = out.failure
        for o in out.outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert list(failed) == ["slow"] and "took more than 0.2 s" in failed["slow"]
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).decode(tokens["ok"])
    assert re.fullmatch("[0-9]{4}", text) and len(tokens["plain"]) == 3
    assert core.structured_output.grammar_bitmask([core_seq() for core_seq in ()]) is None


@pytest.mark.parametrize("dtype", ["float32", "float64"])  # xgrammar's kernel; torch's
def test_the_sampler_masks_what_the_bitmask_forbids_in_its_rows(dtype):
    import torch

    from engine.model_executor.layers.sampler import apply_grammar_bitmask

    logits = torch.zeros(3, 70, dtype=getattr(torch, dtype))
    mask = torch.zeros((3, 3), dtype=torch.int32)  # row 0: not constrained (not in rows)
    mask[1] = -1  # row 1: everything allowed
    mask[2] = torch.tensor([0, 1 << 5, 0], dtype=torch.int32)  # row 2: token 37 only
    out = apply_grammar_bitmask(logits, mask, [1, 2])
    assert torch.isfinite(out[:2]).all()
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == [37]
    narrow = apply_grammar_bitmask(torch.zeros(1, 70), torch.full((1, 1), -1, dtype=torch.int32))
    assert torch.isfinite(narrow).nonzero()[:, 1].tolist() == list(range(32))  # past: padding


def test_constrained_requests_decode_undrafted_beside_speculation(tiny_model):  # noqa: F811
    """With ngram speculation on, a constrained request is never drafted (its
    bitmask has one row a step; drafted, its output broke the regex) while a
    plain one beside it still is."""
    from tokenizers import Tokenizer

    from engine.core.engine_core import EngineCore
    from engine.core.messages import EngineCoreRequest
    from engine.sampling_params import SamplingParams, StructuredOutputsParams

    core = EngineCore(tiny_model, "float32", block_size=32, num_kv_blocks=32, max_model_len=256,
                      bind_threads=False, speculative_config={
                          "method": "ngram", "num_speculative_tokens": 3,
                          "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    regex = "(ab|cd){3,6}"
    repeat = [40, 41, 42, 40, 41, 42, 40, 41, 42, 40, 41]  # a prompt the drafter can match
    core.add_request(EngineCoreRequest("c", repeat, SamplingParams(
        temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=regex))))
    core.add_request(EngineCoreRequest("p", repeat, SamplingParams(temperature=0, max_tokens=20,
                                                                   ignore_eos=True)))
    tokens: dict[str, list[int]] = {}
    while core.has_unfinished():
        for o in core.step().outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    text = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).decode(tokens["c"])
    assert re.fullmatch(regex, text), text  # a drafted constrained request broke it
    assert core.scheduler.spec_stats.num_drafts > 0 and len(tokens["p"]) == 20


def scrambled_copy(model, dest):
    """model's checkpoint with its tokenizer.json's ordinary tokens given each
    other's ids (the same tokens, so it still loads; other ids)."""
    import shutil

    shutil.copytree(model, dest)
    data = json.loads((dest / "tokenizer.json").read_text())
    special = {t["id"] for t in data["added_tokens"]}
    vocab = data["model"]["vocab"]
    names = [t for t, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i not in special]
    ids = sorted(vocab[t] for t in names)
    vocab.update(zip(names, reversed(ids)))
    (dest / "tokenizer.json").write_text(json.dumps(data))
    return dest


@pytest.mark.slow
def test_the_grammar_compiles_for_the_tokenizer_flag_s_tokenizer(tmp_path):
    """--tokenizer DIR on a checkpoint whose own tokenizer differs: the core's
    grammar must be built on DIR's vocabulary, the one the front end decodes."""
    from test_serve import ServerProcess

    from engine.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tok")
    ckpt = scrambled_copy(model, tmp_path / "ckpt")
    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "w": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
        "required": ["n", "w"], "additionalProperties": False}
    s = ServerProcess(ckpt, "--tokenizer", str(model), "--served-model-name", "tiny")
    try:
        r = client(s).completions.create(
            model="tiny", prompt="one two", n=100, max_tokens=120,
            extra_body={"structured_outputs": {"json": schema}}, **SAMPLED)
    finally:
        s.close()
    bad = [ch.text for ch in r.choices if ch.finish_reason != "stop"
           or set(json.loads(ch.text)) != {"n", "w"}]
    assert not bad, bad[:3]


def test_the_bitmask_is_the_same_filled_in_the_step_or_beside_it(tiny_model, monkeypatch):  # noqa: F811
    """Up to FILL_IN_STEP_ROWS constrained rows fill in the step, more in the
    fill thread: the same rows, the same bits; unconstrained rows left out."""
    import time
    from types import SimpleNamespace

    import torch

    import engine.structured_output as so
    from engine.sampling_params import SamplingParams, StructuredOutputsParams

    manager = so.StructuredOutputManager(tiny_model, 512, [1, 3])
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    seqs = [SimpleNamespace(params=params, token_ids=[0, 5], grammar=None, reasoning_ended=True)
            for _ in range(3)]
    for s in seqs[1:]:
        manager.grammar_init(s)
        while manager.ready(s) is False:
            time.sleep(0.01)
    in_step = manager.grammar_bitmask(seqs)
    assert in_step.done()  # filled already: nothing to wait for in the sampler
    monkeypatch.setattr(so, "FILL_IN_STEP_ROWS", 1)
    beside = manager.grammar_bitmask(seqs).result()
    assert in_step.result()[1] == beside[1] == [1, 2]
    assert torch.equal(in_step.result()[0], beside[0])
