"""The engine: a paged-KV model runner that matches transformers token for
token, sampling, platforms, and every run-time variable."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import WORDS, make_checkpoint

from engine import envs, ops
from engine.entrypoints.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = ["the a of to and in is it you", "he was", "people my over know water than call "
           "first who may down side been now find the a of to and in is it you that he was for "
           "on are with as his they", "one have this from or had by hot word but", "water",
           "look more day could go come did number sound no most"]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {t: make_checkpoint(root / t, t, seed=i) for i, t in
            enumerate(("llama", "mistral", "qwen2", "qwen3"))}


def hf_greedy(path: Path, prompt_ids: list[int], n: int) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    # the mask spelled out: generate() would otherwise mask every id equal to
    # pad_token_id, a BOS of 0 included
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def make_llm(path, **kw) -> LLM:
    kw.setdefault("block_size", 32)
    kw.setdefault("num_kv_blocks", 64)
    return LLM(model=path, dtype="float32", bind_threads=False, **kw)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_matches_transformers(checkpoints, model_type):
    llm = make_llm(checkpoints[model_type])
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert [o.request_id for o in outs] == list(range(len(PROMPTS)))
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(checkpoints[model_type], o.prompt_token_ids, 24)


def test_greedy_matches_transformers_under_preemption(checkpoints):
    # 6 blocks of 32 tokens for 6 sequences that each grow past one block
    llm = make_llm(checkpoints["llama"], num_kv_blocks=6, max_model_len=128)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert llm.core.scheduler.num_preemptions > 0
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(checkpoints["llama"], o.prompt_token_ids, 40)
        assert o.outputs[0].finish_reason == "length"


def _linear_modes() -> list:
    """bfloat16 linear layers every way this build and CPU can run them (a visible
    skip for the others): the engine's panels, prepacked oneDNN, plain F.linear,
    and `auto` with every probe capped at AVX2 (VLLM_CPU_MAX_ISA), as on an AMD
    EPYC without AVX-512, where the engine must decide by itself, and at AVX-512
    without AVX512_BF16 (k-major panels where the CPU would take k pairs)."""
    from engine.platforms import cpu_features as cf
    from engine.platforms.cpu_features import CpuIsaError

    params = []
    for requested in ("panels", "onednn", "plain"):
        try:
            cf.choose_linear("bfloat16", cf.current(), cf.TorchLinearSupport.detect(),
                             ops.has_panel_linear(), requested)
            params.append(requested)
        except CpuIsaError as exc:
            params.append(pytest.param(requested, marks=pytest.mark.skip(
                reason=f"bf16 linear mode not run: {exc}")))
    avx512 = "auto-avx512"
    if not cf.current().supports("avx512"):
        avx512 = pytest.param(avx512, marks=pytest.mark.skip(
            reason=f"bf16 capped at avx512 not run: {cf.describe(cf.current())}"))
    return params + ["auto-avx2", avx512]


@pytest.fixture(params=_linear_modes())
def bf16_linear_mode(request, monkeypatch):
    """The mode's cpu_features name, with the environment set to get it."""
    from engine.model_executor.layers import linear
    from engine.platforms import cpu_features as cf

    if request.param.startswith("auto-"):
        monkeypatch.setenv("VLLM_CPU_MAX_ISA", request.param.removeprefix("auto-"))
        monkeypatch.delenv("VLLM_CPU_LINEAR", raising=False)
        want = cf.PANELS if ops.has_panel_linear() else cf.PLAIN
    else:
        monkeypatch.setenv("VLLM_CPU_LINEAR", request.param)
        want = cf.LINEAR_MODES[request.param]
    for cached in (cf.current, linear.cpu_linear_choice, linear.cpu_large_m_choice):
        cached.cache_clear()
    if ops.has_panel_linear():  # the code path import would pick under the cap
        ops.select_cpu_isa("auto")
    yield want
    monkeypatch.delenv("VLLM_CPU_MAX_ISA", raising=False)
    monkeypatch.delenv("VLLM_CPU_LINEAR", raising=False)
    for cached in (cf.current, linear.cpu_linear_choice, linear.cpu_large_m_choice):
        cached.cache_clear()
    if ops.has_panel_linear():
        ops.select_cpu_isa("auto")


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_bfloat16_generation(checkpoints, model_type, bf16_linear_mode):
    import transformers

    llm = LLM(model=checkpoints[model_type], dtype="bfloat16", block_size=32, num_kv_blocks=64,
              bind_threads=False)
    assert llm.core.executor.model.layers[0].input_layernorm.weight.dtype == torch.bfloat16
    assert llm.core.executor.linear_mode == bf16_linear_mode
    gate_up = llm.core.executor.model.layers[0].gate_up
    from engine.model_executor.layers.linear import cpu_large_m_choice

    large = cpu_large_m_choice(torch.bfloat16)  # panels keep oneDNN's copy for large batches
    assert (gate_up.packed is not None, gate_up.panels is not None) == (
        bf16_linear_mode == "onednn-prepacked" or (
            bf16_linear_mode == "engine-panels" and large.rows is not None
            and large.mode == "onednn-prepacked"),
        bf16_linear_mode == "engine-panels")
    if gate_up.panels is not None:  # k pairs exactly on the avx512_bf16 code path
        pairs = ops.panel_k_pack(torch.bfloat16) == 2
        assert gate_up.panels.shape[2] == (32 if pairs else 16)
        assert pairs == (ops.cpu_isa() == "avx512_bf16")
        cap = os.environ.get("VLLM_CPU_MAX_ISA")
        if cap:
            assert ops.cpu_isa() == cap
        from engine.model_executor.layers.linear import cpu_linear_choice

        assert ("AVX512_BF16" in cpu_linear_choice(torch.bfloat16).reason) == pairs
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[model_type],
                                                          dtype=torch.bfloat16).eval()
    agree = 0
    for o in outs:
        assert len(o.outputs[0].token_ids) == 8
        with torch.no_grad():
            logits = hf(torch.tensor([o.prompt_token_ids])).logits[0, -1].float()
        # bf16 rounding differs between implementations: the first token is one
        # of transformers' top-3 and is usually its argmax
        assert o.outputs[0].token_ids[0] in logits.topk(3).indices.tolist()
        agree += o.outputs[0].token_ids[0] == int(logits.argmax())
    assert agree >= len(outs) - 1


# prompts of 10, 3, 35, 11, 2, 12 tokens: each case's bounds bind at some step
@pytest.mark.parametrize("max_num_seqs,max_num_batched_tokens", [(2, 48), (6, 48), (12, 64)])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
def test_every_step_within_batch_bounds(checkpoints, max_num_seqs, max_num_batched_tokens,
                                        chunked):
    llm = make_llm(checkpoints["llama"], max_num_seqs=max_num_seqs, max_model_len=48,
                   max_num_batched_tokens=max_num_batched_tokens,
                   enable_chunked_prefill=chunked)
    steps = []
    schedule = llm.core.scheduler.schedule

    def spy():
        out = schedule()
        steps.append((len(out.scheduled), out.num_scheduled_tokens))
        return out

    llm.core.scheduler.schedule = spy
    ref = make_llm(checkpoints["llama"])
    p = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS * 2, p)] == \
        [o.outputs[0].token_ids for o in ref.generate(PROMPTS * 2, p)]
    # the step's tokens as the SchedulerOutput names them, read when it is made
    steps = [(n, sum(tokens.values())) for n, tokens in steps]
    assert max(n for n, _ in steps) == max_num_seqs  # the bounds were reached...
    assert max(t for _, t in steps) > max_num_batched_tokens * 3 // 4
    for n, tokens in steps:  # ...and never passed
        assert n <= max_num_seqs and tokens <= max_num_batched_tokens, steps


def test_batch_bounds_are_honest(checkpoints):
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(40\) is smaller than "
                       r"max_model_len \(64\): without chunked prefill"):
        make_llm(checkpoints["llama"], max_model_len=64, max_num_batched_tokens=40,
                 enable_chunked_prefill=False)
    chunked = make_llm(checkpoints["llama"], max_model_len=64, max_num_batched_tokens=40,
                       max_num_seqs=8)  # chunked prefill (the default) runs long prompts in parts
    assert chunked.core.scheduler.max_num_batched_tokens == 40
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(64\) must be >= "
                       r"max_num_seqs \(100\)"):
        make_llm(checkpoints["llama"], max_model_len=64, max_num_batched_tokens=64,
                 max_num_seqs=100)
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        make_llm(checkpoints["llama"], max_num_seqs=0)
    llm = make_llm(checkpoints["llama"], max_model_len=64, enable_chunked_prefill=False)
    assert llm.core.scheduler.max_num_batched_tokens == 8192  # unset: a default that fits
    assert make_llm(checkpoints["llama"]).core.scheduler.max_num_batched_tokens == 2048


def test_seeded_generator_lives_on_the_logits_device(checkpoints, monkeypatch):
    from engine.core.sequence import Sequence

    llm = make_llm(checkpoints["llama"])
    devices = []
    made = Sequence.generator

    def spy(self, device):
        devices.append(torch.device(device))
        return made(self, device)

    monkeypatch.setattr(Sequence, "generator", spy)
    llm.generate(PROMPTS[0], SamplingParams(temperature=1.0, seed=3, max_tokens=3))
    assert devices and set(devices) == {llm.core.executor.runner.device}
    seq = Sequence([1, 2], SamplingParams(seed=1))
    g = seq.generator(torch.device("cpu"))
    assert g.device.type == "cpu" and seq.generator(torch.device("cpu")) is g
    assert Sequence([1], SamplingParams()).generator(torch.device("cpu")) is None


def test_sampling_seed_top_k_top_p_and_stops(checkpoints):
    llm = make_llm(checkpoints["llama"])
    prompt = PROMPTS[0]

    def gen(**kw):
        return llm.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True, **kw))[0].outputs[0]

    a, b = gen(temperature=1.0, seed=7), gen(temperature=1.0, seed=7)
    assert a.token_ids == b.token_ids  # a per-request seed makes sampling repeatable
    assert gen(temperature=1.0, seed=8).token_ids != a.token_ids or gen(temperature=1.0, seed=9).token_ids != a.token_ids
    greedy = gen(temperature=0)
    assert gen(temperature=0.7, top_k=1, seed=3).token_ids == greedy.token_ids
    assert gen(temperature=0.7, top_p=1e-6, seed=3).token_ids == greedy.token_ids
    stop_id = greedy.token_ids[3]
    s = gen(temperature=0, stop_token_ids=[stop_id])
    assert s.token_ids == greedy.token_ids[:greedy.token_ids.index(stop_id) + 1]
    assert s.finish_reason == "stop"
    word = greedy.text.split()[2]
    t = gen(temperature=0, stop=[word])
    assert t.finish_reason == "stop" and word not in t.text and greedy.text.startswith(t.text)
    five = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert len(five.outputs[0].token_ids) == 5 and five.outputs[0].finish_reason == "length"


def test_eos_stops_unless_ignored(checkpoints):
    llm = make_llm(checkpoints["llama"])
    greedy = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=30,
                                                     ignore_eos=True))[0].outputs[0].token_ids
    # the core's scheduler checks the checkpoint's end-of-sequence ids: make greedy[4] one
    assert llm.core.scheduler.eos_token_ids == tuple(llm.core.config.eos_token_ids)
    llm.core.scheduler.eos_token_ids = (greedy[4],)
    out = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    assert out.token_ids == greedy[:greedy.index(greedy[4]) + 1] and out.finish_reason == "stop"
    ignored = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=30,
                                                      ignore_eos=True))[0].outputs[0]
    assert ignored.token_ids == greedy and ignored.finish_reason == "length"


def test_sampling_params_validation():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(max_tokens=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_kv_cache_too_small_or_too_big(checkpoints, monkeypatch):
    with pytest.raises(ValueError, match="cannot hold one sequence of the model's context"):
        make_llm(checkpoints["llama"], num_kv_blocks=2)  # 64 tokens < 512 context
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "100000")
    with pytest.raises(ValueError, match="asks for 100000.00 GiB of KV cache but only"):
        LLM(model=checkpoints["llama"], dtype="float32", bind_threads=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    with pytest.raises(envs.EnvError, match="VLLM_CPU_KVCACHE_SPACE='lots' is not a number"):
        LLM(model=checkpoints["llama"], dtype="float32", bind_threads=False)


def test_bad_model_folder_and_prompt(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="has no config.json"):
        LLM(model=tmp_path, bind_threads=False)
    llm = make_llm(checkpoints["llama"], max_model_len=8)
    with pytest.raises(ValueError, match="the model's context is 8"):
        llm.generate("the a of to and in is it you that he was")
    with pytest.raises(ValueError, match="block_size must be a positive multiple of 32"):
        make_llm(checkpoints["llama"], block_size=16)


def test_upstream_prompt_dicts(checkpoints):
    """vLLM's TextPrompt and TokensPrompt dicts run as the string and the ids;
    any other dict is one clear error."""
    from engine.sampling_params import SamplingParams

    llm = make_llm(checkpoints["llama"], max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    text = "the a of to"
    ids = llm.get_tokenizer().encode(text).ids
    want = llm.generate([text, ids], params)
    got = llm.generate([{"prompt": text}, {"prompt_token_ids": ids}], params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert got[0].prompt == text and got[1].prompt_token_ids == ids
    (one,) = llm.generate({"prompt_token_ids": ids}, params)
    assert one.outputs[0].token_ids == want[1].outputs[0].token_ids
    for bad in ({"prompt": text, "multi_modal_data": {}}, {"text": text}, {"prompt": ids}):
        with pytest.raises(ValueError, match="a prompt dict holds one key, 'prompt'"):
            llm.generate([bad], params)


def test_cli_generate_and_env(checkpoints, capsys):
    from engine.cli import main

    assert main(["generate", "--model", str(checkpoints["llama"]), "--dtype", "float32",
                 "--block-size", "32", "--prompt", "the a of", "--max-tokens", "5"]) == 0
    words = capsys.readouterr().out.split()
    assert len(words) == 5 and set(words) <= set(WORDS)
    assert main(["env"]) == 0
    assert "platform_class" in capsys.readouterr().out
    assert main(["generate", "--model", "/nonexistent", "--prompt", "x"]) == 2
    assert "'/nonexistent' is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("value,want_plain", [("0", True), ("1", False), (None, False)])
def test_zentorch_weight_prepack_on_amd_zen(checkpoints, monkeypatch, value, want_plain):
    """Upstream's VLLM_ZENTORCH_WEIGHT_PREPACK: on the zen_cpu platform `0` keeps
    torch's plain weights; `1` (the default) lays them out as the engine decides."""
    from engine import platforms
    from engine.platforms.cpu_features import PLAIN
    from engine.worker import cpu_worker

    monkeypatch.setattr(cpu_worker, "current_platform", platforms.ZenCpuPlatform)
    if value is None:
        monkeypatch.delenv("VLLM_ZENTORCH_WEIGHT_PREPACK", raising=False)
    else:
        monkeypatch.setenv("VLLM_ZENTORCH_WEIGHT_PREPACK", value)
    llm = make_llm(checkpoints["llama"])
    from engine.model_executor.layers.linear import cpu_linear_choice

    executor = llm.core.executor
    assert executor.linear_mode == (PLAIN if want_plain else cpu_linear_choice(torch.float32).mode)
    assert (executor.model.layers[0].qkv.weight is not None) == (executor.linear_mode == PLAIN)
    outs = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(checkpoints["llama"], o.prompt_token_ids, 8)


def test_a_damaged_checkpoint_is_refused_in_one_line(checkpoints, tmp_path):
    """Weights are read straight into the parameters (no memory map); a header
    that points past the file's end, or a file cut short, is named, not read."""
    import shutil

    src = Path(checkpoints["llama"])
    for case in ("truncated", "header"):
        d = tmp_path / case
        shutil.copytree(src, d)
        st = next(d.glob("*.safetensors"))
        data = st.read_bytes()
        if case == "truncated":
            st.write_bytes(data[: len(data) - 1000])
            want = "lies outside the file"
        else:
            st.write_bytes(data[:8] + b"{" * (len(data) - 8))
            want = "not a safetensors file"
        with pytest.raises(ValueError, match=want) as exc:
            make_llm(d)
        assert "\n" not in str(exc.value) and st.name in str(exc.value)
