"""A `vllm serve` command line starts `engine serve` (issue 38): upstream's
flags either do what upstream's do or are refused by name in one line. The
fast tests parse and refuse without a model; the slow one serves the tiny
model under a long vLLM command line and checks what the flags change."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.cli import main
from engine.config import generation_defaults


def _serve_error(capsys, *argv) -> str:
    assert main(["serve", "/nonexistent-model", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.mark.parametrize("argv, needle", [
    (["--lora-modules", "a=b"], "--lora-modules serves adapters; add --enable-lora"),
    (["--enable-lora", "--lora-dtype", "float16"], "--lora-dtype float16: not supported by "
     "this engine (adapters run in the model's dtype)"),
    (["--quantization", "awq"], "--quantization is not supported by this engine: the "
     "quantization is read from the checkpoint's config.json"),
    (["--ssl-keyfile", "k.pem"], "--ssl-keyfile is not supported"),
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8: not supported by this engine"),
    (["--tokenizer-mode", "mistral"], "--tokenizer-mode mistral: not supported"),
    (["--scheduling-policy", "priority"], "--scheduling-policy priority"),
    (["--max-logprobs", "-2"], "--max-logprobs must be -1"),
    (["--allowed-origins", '"x"'], "--allowed-origins must be a JSON list"),
])
def test_flags_the_engine_cannot_honour_are_refused_by_name(capsys, argv, needle):
    err = _serve_error(capsys, *argv)
    assert needle in err, err


@pytest.mark.parametrize("argv", [["--enable-prompt-embeds"], ["--tool-server", "x"],
                                  ["--ubatch-size=4"], ["--no-enable-dbo"]])
def test_any_other_vllm_flag_is_named_in_one_line(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(["serve", "/nonexistent-model", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    flag = argv[0].split("=")[0].replace("--no-", "--")
    assert err == f"error: {flag} is a `vllm serve` flag this engine does not implement; " \
        "leave it out (docs/serving.md#vllm-flags lists those it takes)", err


def test_a_vllm_command_line_parses():
    """Every flag of the command line the slow test serves with, parsed (a
    flag missing from the parser exits 2 with 'unrecognized arguments')."""
    import argparse

    from engine.cli import _parse

    p = argparse.ArgumentParser(prog="engine")
    sub = p.add_subparsers(dest="command", required=True)
    from engine.entrypoints.cli import serve

    serve.add_parser(sub)
    args = _parse(p, sub, ["serve", "m", *VLLM_ARGV])
    assert (args.trust_remote_code, args.seed, args.max_logprobs) == (True, 7, 25)
    assert args.served_model_name == ["served"] and args.enable_log_requests
    assert args.override_generation_config == {"top_k": 3}
    from engine.entrypoints.openai.cli_args import check_args

    check_args(args)
    assert args.dtype == "float32"  # vLLM's `--dtype float`


def test_generation_config_sources(tmp_path):
    model, other = tmp_path / "model", tmp_path / "other"
    for folder, gen in ((model, {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 40,
                                 "eos_token_id": 2}),
                        (other, {"temperature": 0.0, "min_p": 0.1})):
        folder.mkdir()
        (folder / "generation_config.json").write_text(json.dumps(gen))
    assert generation_defaults(model) == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 40}
    assert generation_defaults(model, "vllm") == {}
    assert generation_defaults(model, str(other)) == {"temperature": 0.0, "min_p": 0.1}
    assert generation_defaults(model, "vllm", {"top_k": 5}) == {"top_k": 5}
    assert generation_defaults(model, "auto", {"temperature": 1.0})["temperature"] == 1.0
    with pytest.raises(ValueError, match="--generation-config nowhere: not a folder"):
        generation_defaults(model, "nowhere")


# a command line as users copy it from vLLM's docs (DIR and TOK are filled in)
VLLM_ARGV = ["--dtype", "float", "--trust-remote-code", "--seed", "7", "--max-logprobs", "25",
             "--disable-log-stats", "--enable-log-requests", "--max-log-len", "100",
             "--served-model-name", "served", "--max-num-seqs", "8",
             "--max-num-batched-tokens", "2048", "--enable-prefix-caching",
             "--enable-chunked-prefill", "--response-role", "bot",
             "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log",
             "--enforce-eager", "--kv-cache-dtype", "auto", "--load-format", "safetensors",
             "--enable-request-id-headers", "--override-generation-config", '{"top_k": 3}']


@pytest.mark.slow
def test_a_vllm_command_line_serves(tiny_model, tmp_path):  # noqa: F811
    from test_serve import ServerProcess, client

    gen, tok = tmp_path / "gen", tmp_path / "tok"
    gen.mkdir()
    (gen / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    shutil.copytree(tiny_model, tok, ignore=shutil.ignore_patterns("*.safetensors"))
    (tok / "chat_template.jinja").write_text("{{ messages[-1]['content'] }}")  # --tokenizer's
    s = ServerProcess(tiny_model, *VLLM_ARGV, "--generation-config", str(gen),
                      "--tokenizer", str(tok))
    try:
        c = client(s)
        assert [m.id for m in c.models.list().data] == ["served"]
        # --generation-config DIR: temperature 0 by default, so two unseeded answers agree
        a, b = (c.completions.create(model="served", prompt="one two", max_tokens=8).choices[0]
                .text for _ in range(2))
        assert a == b
        chat = c.chat.completions.create(model="served", max_tokens=2,
                                         messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.role == "bot"  # --response-role
        assert chat.usage.prompt_tokens == 2  # --tokenizer's template: "hi" alone, 2 tokens
        r = c.completions.with_raw_response.create(model="served", prompt="x", max_tokens=1,
                                                   logprobs=25,  # past the default 20
                                                   extra_body={"return_tokens_as_token_ids":
                                                               True})  # ids: 25 distinct keys
        assert r.headers.get("x-request-id")  # --enable-request-id-headers
        assert len(r.parse().choices[0].logprobs.top_logprobs[0]) >= 25
        with pytest.raises(Exception) as info:  # --max-logprobs 25
            c.completions.create(model="served", prompt="x", max_tokens=1, logprobs=26)
        assert "at most 25" in str(info.value)
        assert "Received request" in s.output()  # --enable-log-requests
    finally:
        s.close()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny"
    assert main(["make-tiny-model", str(path)]) == 0
    return path


def test_seed_makes_unseeded_sampling_repeat(tiny_model):
    """--seed (an engine argument, as upstream's): two engines of one seed
    sample the same unseeded tokens; another seed, others."""
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    def sample(seed):
        llm = LLM(tiny_model, "float32", seed=seed, block_size=32, num_kv_blocks=16,
                  max_model_len=256, bind_threads=False)
        params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
        return [o.outputs[0].token_ids for o in llm.generate(["one two", "three"], params)]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
