"""Linear layers for every batch size: the panel kernel for few rows (decode),
oneDNN's GEMM or F.linear from the crossover on (prefill), as
engine.platforms.cpu_features.choose_large_m decides and VLLM_CPU_LINEAR_LARGE_M
overrides."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import envs, ops
from engine.model_executor.layers import linear
from engine.platforms import cpu_features as cf
from test_cpu_features import EPYC_AVX2, TORCH, XEON_AMX, ZEN4, features

PANELS = cf.LinearChoice(cf.PANELS, "")


@pytest.mark.parametrize("isa,flags,dtype,rows,mode", [
    ("avx512_bf16", ZEN4, "bfloat16", 256, cf.PREPACKED),
    ("avx512_bf16", ZEN4, "float32", 256, cf.PREPACKED),
    ("avx512_bf16", XEON_AMX, "float32", 128, cf.PREPACKED),  # oneDNN ahead sooner there
    ("avx512_bf16", XEON_AMX, "bfloat16", 8, cf.PREPACKED),   # AMX tiles from 8 rows
    ("avx2", XEON_AMX, "float32", 128, cf.PREPACKED),         # capped: the avx2 crossover
    ("avx2", EPYC_AVX2, "float32", 128, cf.PREPACKED),
    ("avx2", EPYC_AVX2, "bfloat16", None, cf.PANELS),   # no oneDNN bf16 there: panels always
])
def test_crossover_per_code_path(isa, flags, dtype, rows, mode):
    c = cf.choose_large_m(dtype, isa, PANELS, TORCH, features(flags))
    assert (c.rows, c.mode) == (rows, mode), c.reason


def test_only_panel_layers_switch_and_the_variable_overrides():
    onednn = cf.LinearChoice(cf.PREPACKED, "")
    assert cf.choose_large_m("float32", "avx2", onednn, TORCH, features(ZEN4)).rows is None
    off = cf.choose_large_m("float32", "avx2", PANELS, TORCH, features(ZEN4), requested=0)
    assert off.rows is None and "no second weight copy" in off.reason
    assert cf.choose_large_m("float32", "avx2", PANELS, TORCH, features(ZEN4), 64).rows == 64


@pytest.mark.parametrize("value,parsed", [("", None), ("auto", None), ("0", 0), ("300", 300)])
def test_env_parses(value, parsed):
    assert envs.cpu_linear_large_m({"VLLM_CPU_LINEAR_LARGE_M": value}) == parsed


def test_env_refuses_in_one_line():
    with pytest.raises(envs.EnvError, match="VLLM_CPU_LINEAR_LARGE_M='-3' is not valid"):
        envs.cpu_linear_large_m({"VLLM_CPU_LINEAR_LARGE_M": "-3"})


def test_prefill_attention_env_refuses_in_one_line():
    with pytest.raises(envs.EnvError, match="VLLM_PREFILL_ATTENTION='flash' is not valid"):
        envs.prefill_attention({"VLLM_PREFILL_ATTENTION": "flash"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_paths_compute_the_layer(monkeypatch, dtype):
    if not ops.has_panel_linear():
        pytest.skip("this code path has no panel kernel: F.linear runs every batch")
    monkeypatch.setenv("VLLM_CPU_LINEAR_LARGE_M", "8")
    # panels as the layers' mode even where auto picks oneDNN (bfloat16 with AMX)
    monkeypatch.setenv("VLLM_CPU_LINEAR", "panels")
    linear.cpu_large_m_choice.cache_clear()
    linear.cpu_linear_choice.cache_clear()
    try:
        layer = linear.Linear(64, 40, bias=True, dtype=dtype)
        torch.nn.init.normal_(layer.weight)
        torch.nn.init.normal_(layer.bias)
        w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
        layer.prepare(cf.PANELS)
        assert layer.panels is not None and layer.large_rows == 8
        for m in (3, 8, 20):  # below the crossover (panels) and from it on
            x = torch.randn(m, 64).to(dtype)
            want = F.linear(x.float(), w.float(), b.float())
            tol = 1e-4 if dtype == torch.float32 else 0.3
            torch.testing.assert_close(layer(x).float(), want, atol=tol, rtol=2e-2)
    finally:
        linear.cpu_large_m_choice.cache_clear()
        linear.cpu_linear_choice.cache_clear()


def test_large_batches_leave_the_panel_kernel(monkeypatch):
    if not ops.has_panel_linear():
        pytest.skip("this code path has no panel kernel")
    monkeypatch.setenv("VLLM_CPU_LINEAR_LARGE_M", "8")
    linear.cpu_large_m_choice.cache_clear()
    calls = []
    monkeypatch.setattr(ops, "linear", lambda *a: calls.append(a[1].shape[0]))
    try:
        layer = linear.Linear(32, 16, bias=False, dtype=torch.float32)
        torch.nn.init.normal_(layer.weight)
        layer.prepare(cf.PANELS)
        layer(torch.randn(4, 32))
        layer(torch.randn(9, 32))
        assert calls == [4]
    finally:
        linear.cpu_large_m_choice.cache_clear()
