"""Multi-LoRA (issue 41): PEFT adapters over a tiny base, each request's greedy
ids equal to its adapter merged into the base (peft's merge_and_unload, loaded
by the engine as a checkpoint), on every linear layout; a step mixing adapters
and the base equal to each alone; the quantized bases; the LRU; the refusals.
The served side: tests/entrypoints/test_lora_serve.py."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from lora_adapters import make_adapter

from engine import LLM, SamplingParams, ops
from engine.config import ModelConfig
from engine.lora import LoRARequest
from engine.lora.config import LoRAConfig
from engine.lora.peft_helper import load_adapter

pytest.importorskip("peft", reason="peft is a dev requirement (requirements/dev.txt)")

PROMPTS = ["hello world the", "a b c d e f", "one two three four five"]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
ARGS = {"block_size": 32, "num_kv_blocks": 32, "max_model_len": 256, "bind_threads": False}


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """The tiny base, three adapters (rank 8 on every module; rank 4 rslora on
    q, v, down; rank 16 on o, gate, up) and each merged into the base."""
    from engine.tiny_model import make_tiny_model

    d = tmp_path_factory.mktemp("lora")
    base = make_tiny_model(d / "base")
    specs = {"a1": {"rank": 8, "seed": 1},
             "a2": {"rank": 4, "seed": 2, "rslora": True,
                    "targets": ("q_proj", "v_proj", "down_proj")},
             "a3": {"rank": 16, "alpha": 8, "seed": 3,
                    "targets": ("o_proj", "gate_proj", "up_proj")}}
    for name, kw in specs.items():
        make_adapter(base, d / name, merged=d / f"merged-{name}", **kw)
    return d


def _ids(llm: LLM, prompts=PROMPTS, **kw) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, **kw)]


def _req(d, name: str) -> LoRARequest:
    return LoRARequest(name, int(name[1:]), str(d / name))


@pytest.fixture(scope="module")
def merged(lora) -> dict[str, list[list[int]]]:
    """Each merged checkpoint's greedy ids (float32), and the base's."""
    out = {}
    for name in ("a1", "a2", "a3", "base"):
        llm = LLM(lora / (f"merged-{name}" if name != "base" else "base"), "float32", **ARGS)
        out[name] = _ids(llm)
        del llm
    assert len({json.dumps(v) for v in out.values()}) == 4, "the adapters change nothing"
    return out


@pytest.fixture(params=["panels", "onednn", "plain"])
def linear_mode(request, monkeypatch):
    """Each layout of the base's linear layers (VLLM_CPU_LINEAR)."""
    from engine import ops
    from engine.model_executor.layers import linear
    from engine.platforms import cpu_features as cf

    if request.param == "panels" and not ops.has_panel_linear():
        pytest.skip("this build has no panel kernels")
    monkeypatch.setenv("VLLM_CPU_LINEAR", request.param)
    for cached in (cf.current, linear.cpu_linear_choice, linear.cpu_large_m_choice):
        cached.cache_clear()
    yield cf.LINEAR_MODES[request.param]
    monkeypatch.delenv("VLLM_CPU_LINEAR")
    for cached in (cf.current, linear.cpu_linear_choice, linear.cpu_large_m_choice):
        cached.cache_clear()


def test_each_adapter_equals_its_merged_model_and_mixed_steps_equal_each_alone(
        lora, merged, linear_mode):
    llm = LLM(lora / "base", "float32", enable_lora=True, max_loras=3, max_lora_rank=16,
              **ARGS)
    assert llm.core.executor.runner.linear_mode == linear_mode
    for name in ("a1", "a2", "a3"):
        assert _ids(llm, lora_request=_req(lora, name)) == merged[name], name
    assert _ids(llm) == merged["base"]
    # one step (prefill, then decodes) over every adapter and the base, prompts interleaved
    order = ["a1", "base", "a2", "a3", "a1", "base", "a3", "a2", "base"]
    prompts = [PROMPTS[i % 3] for i in range(len(order))]
    reqs = [None if n == "base" else _req(lora, n) for n in order]
    got = _ids(llm, prompts, lora_request=reqs)
    assert got == [merged[n][i % 3] for i, n in enumerate(order)]


@pytest.mark.parametrize("path", ["kernel", "gemms"])
def test_both_term_paths_equal_the_merged_models(lora, merged, path, monkeypatch):
    """The few-token kernel (ops.lora_add) and torch's GEMMs, each forced for
    every step (prefill and decode, one adapter and mixed), keep each adapter's
    ids equal to its merged model's."""
    from engine.lora import layers

    most = 1 << 20 if path == "kernel" else -1
    monkeypatch.setattr(layers, "KERNEL_MAX_TOKENS_ONE", most)
    monkeypatch.setattr(layers, "KERNEL_MAX_TOKENS_MIXED", most)
    calls, real = [], ops.lora_add_kernel()
    monkeypatch.setattr(ops, "lora_add_kernel",
                        lambda: real and (lambda *a: calls.append(1) or real(*a)))
    llm = LLM(lora / "base", "float32", enable_lora=True, max_loras=3, max_lora_rank=16,
              **ARGS)
    assert _ids(llm, lora_request=_req(lora, "a1")) == merged["a1"]
    order = ["a2", "base", "a3", "a1", "base", "a2"]
    reqs = [None if n == "base" else _req(lora, n) for n in order]
    prompts = [PROMPTS[i % 3] for i in range(len(order))]
    assert _ids(llm, prompts, lora_request=reqs) == [merged[n][i % 3] for i, n in enumerate(order)]
    assert bool(calls) == (path == "kernel" and ops.has_lora_kernel())


def test_adapters_beyond_max_loras_wait_and_the_lru_evicts(lora, merged):
    """max_loras 1: a step holds one adapter (the others wait, base requests
    run beside it); max_cpu_loras 2: a third adapter drops the least recently
    used from memory, and it is read again when asked for."""
    llm = LLM(lora / "base", "float32", enable_lora=True, max_loras=1, max_cpu_loras=2,
              max_lora_rank=16, **ARGS)
    manager = llm.core.executor.runner.lora_manager
    order = ["a1", "a2", "base", "a1", "a2"]
    reqs = [None if n == "base" else _req(lora, n) for n in order]
    assert _ids(llm, PROMPTS[:1] * 5, lora_request=reqs) == [merged[n][0] for n in order]
    assert list(manager.loaded) == [1, 2]
    assert _ids(llm, lora_request=_req(lora, "a3")) == merged["a3"]
    assert list(manager.loaded) == [2, 3] and manager.slots == [3]
    assert _ids(llm, lora_request=_req(lora, "a1")) == merged["a1"]
    assert list(manager.loaded) == [3, 1]


def test_prefix_cache_is_not_shared_between_adapters(lora, merged):
    llm = LLM(lora / "base", "float32", enable_lora=True, max_loras=2, max_lora_rank=16,
              enable_prefix_caching=True, **ARGS)
    long = [" ".join(["a b c d e f"] * 12)]  # several full blocks
    base = _ids(llm, long)
    with_a1 = _ids(llm, long, lora_request=_req(lora, "a1"))
    ref = LLM(lora / "merged-a1", "float32", **ARGS)
    assert with_a1 == _ids(ref, long) and with_a1 != base


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16", "bfloat16"])
def test_the_lora_term_is_added_to_a_quantized_layers_output(lora, tmp_path, scheme):
    """On a quantized base (and on bfloat16's kernels, where the merged model
    rounds W + BA, so its ids are not the reference) the term is the layer's
    own output plus x A^T B^T, computed apart in torch; and the adapter
    changes the output."""
    from engine.cli import main
    from engine.forward_context import ForwardContext, set_context
    from engine.lora.layers import LoRAMapping

    dtype = torch.bfloat16 if scheme == "bfloat16" else torch.float32
    q = lora / "base"
    if scheme != "bfloat16":
        q = tmp_path / scheme
        args = ["--scheme", scheme] + (["--group-size", "32"] if scheme == "w4a16" else [])
        assert main(["quantize", str(lora / "base"), str(q), *args]) == 0
    llm = LLM(q, str(dtype).removeprefix("torch."), enable_lora=True, max_loras=2,
              max_lora_rank=16, **ARGS)
    plain = _ids(llm)
    assert _ids(llm, lora_request=_req(lora, "a1")) != plain
    manager = llm.core.executor.runner.lora_manager
    w = manager.loaded[1]
    layer = manager.layers[(0, "gate_up")]
    assert (layer.base.quant_method is not None) == (scheme != "bfloat16")
    x = torch.randn(5, layer.fan_in, dtype=dtype)
    rows = torch.tensor([0, 2, 3])  # the adapter's tokens; the others are the base's
    token_slot = torch.full((5,), -1, dtype=torch.int32)
    token_slot[rows] = manager.slots.index(1)
    set_context(ForwardContext(False, torch.zeros(5, dtype=torch.int64),
                               torch.zeros(1, 1, dtype=torch.int32),
                               torch.zeros(1, dtype=torch.int32),
                               lora_mapping=LoRAMapping(None, token_slot)))
    try:
        got = layer(x)
    finally:
        set_context(None)
    want = layer.base(x).float()
    for j, off in enumerate(layer.offsets):
        a, b = (t.float() for t in w.weights[(0, "gate_up", j)])
        n = layer.slices[j]
        want[rows, off:off + n] += x[rows].float() @ a.t() @ b.t()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def _rewrite_config(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


def test_bad_adapters_are_refused_in_one_line(lora, tmp_path):
    mc = ModelConfig.from_dir(lora / "base")

    def refused(path, max_rank=16) -> str:
        with pytest.raises(ValueError) as e:
            load_adapter("x", path, mc, max_rank)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "rank 16 is larger than --max-lora-rank 8" in refused(lora / "a3", 8)
    assert "is not a folder" in refused(lora / "a1" / "adapter_config.json")
    assert "no readable adapter_config.json" in refused(lora / "base")
    assert "unknown target module 'lm_head'" in refused(
        _rewrite_config(lora / "a1", tmp_path / "lm", target_modules=["q_proj", "lm_head"]))
    # the same adapter claiming another rank: its tensors do not fit
    assert "shape mismatch" in refused(_rewrite_config(lora / "a1", tmp_path / "r4", r=4))
    other = make_adapter(_wider_base(tmp_path / "wide"), tmp_path / "other", rank=4)
    assert "shape mismatch" in refused(other)


def _wider_base(folder):
    """A Llama of another width (an adapter of it does not fit the tiny base)."""
    from helpers import make_checkpoint

    return make_checkpoint(folder, hidden=32, heads=2, kv_heads=1, inter=64)


def test_engine_refusals(lora):
    with pytest.raises(ValueError, match="runs on one rank so far"):
        LLM(lora / "base", "float32", enable_lora=True, tensor_parallel_size=2, **ARGS)
    with pytest.raises(ValueError, match="max_cpu_loras .* must be >= max_loras"):
        LoRAConfig(max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="lora_int_id must be >= 1"):
        LoRARequest("x", 0, "p")
    llm = LLM(lora / "base", "float32", **ARGS)
    with pytest.raises(ValueError, match="start the engine with --enable-lora"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=_req(lora, "a1"))


def test_runtime_update_routes_only_with_the_variable(lora, monkeypatch):
    """/v1/load_lora_adapter and /v1/unload_lora_adapter exist only when
    VLLM_ALLOW_RUNTIME_LORA_UPDATING is 1 or true (upstream's switch)."""
    from helpers import app_in_process

    from engine.entrypoints.openai.api_server import build_app
    from engine.entrypoints.openai.serving_models import LoRAModels

    app, llm = app_in_process(lora / "base", enable_lora=True)
    try:
        state = app.state.s
        state.lora = LoRAModels(llm.model_config, 16, state.model_names)
        for value, served in (("", False), ("0", False), ("true", True), ("1", True)):
            monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", value)
            paths = {r.path for r in build_app(state).routes}
            assert ("/v1/load_lora_adapter" in paths) is served, value
            assert ("/v1/unload_lora_adapter" in paths) is served, value
    finally:
        llm.shutdown()
