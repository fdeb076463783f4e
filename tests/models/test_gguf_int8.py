"""GGUF layers with x rounded to int8 (engine.model_executor.layers.
quantization.gguf_int8, as llama.cpp multiplies): every block type's layer,
fused ones of mixed types included, stays within x's rounding of the float
product; a tied LM head runs on the file's blocks, equal to the dequantized
embedding's product."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
from gguf_files import QUANT_SHAPE, write_gguf
from test_gguf import MIXED

from engine import ops

pytest.importorskip("gguf", reason="gguf is a runtime requirement (requirements/common.txt)")
pytestmark = pytest.mark.skipif(not ops.has_gguf_int8_linear(),
                                reason="no gguf_int8 kernel on this code path (wna16 runs)")
ENGINE = dict(max_model_len=128, num_kv_blocks=8, block_size=32, bind_threads=False)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    from engine import tiny_model

    work = tmp_path_factory.mktemp("gguf_int8")
    with mock.patch.dict("os.environ", {"VLLM_CACHE_ROOT": str(work / "cache")}), \
            mock.patch.dict(tiny_model.SHAPE, QUANT_SHAPE):
        yield tiny_model.make_tiny_model(work / "tiny"), work


def _model(file, **env):
    from engine.entrypoints.llm import LLM

    with mock.patch.dict("os.environ", env):
        return LLM(model=str(file), dtype="float32", **ENGINE).core.executor.runner.model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_every_type_within_x_rounding(src):
    """int8 x (one part in 254 of a group's largest) moves a product by well
    under 2% of its norm; a wrong lane order or group term moves it by ~100%."""
    tiny, work = src
    model = _model(write_gguf(tiny, work / "mixed.gguf", types=MIXED))
    layers = [m for m in model.modules() if getattr(m, "gguf_int8", None)]
    assert len(layers) == 6 and model.lm_head in layers  # the others: float or TQ1_0
    # each run of a type at its file's bits: Q4_1 | Q5_0 | Q4_1 is three runs
    assert {w.bits for layer in layers for w in layer.gguf_int8} == {4, 5, 6, 8}
    assert max(len(layer.gguf_int8) for layer in layers) == 3
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        assert layer.gguf_int8_rows >= 64  # float32: prefill's batches too, AMX or not
        for rows in (1, 5, 16, 64):  # 64: several blocks of the kernel's 4 or 8 rows
            x = torch.randn(rows, layer.in_features, generator=g)
            got = layer(x)
            rows_was, layer.gguf_int8_rows = layer.gguf_int8_rows, 0  # the float kernel
            want = layer(x)
            layer.gguf_int8_rows = rows_was
            assert _rel(got, want) < 0.02, (layer.quant_method, rows)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_tied_head_runs_the_file_blocks(src, qtype):
    tiny, work = src
    file = write_gguf(tiny, work / f"tied-{qtype}.gguf", qtype, drop=("output.weight",))
    x = torch.randn(3, QUANT_SHAPE["hidden_size"], generator=torch.Generator().manual_seed(1))
    for rows, tol in (("0", 1e-5), ("auto", 0.02)):
        model = _model(file, VLLM_GGUF_INT8_MAX_M=rows)
        assert model.config.tie_word_embeddings and model.lm_head.quant_method is not None
        want = x @ model.embed_tokens.T  # the dequantized blocks the lookup reads
        assert _rel(model.lm_head(x), want) < tol


@pytest.mark.parametrize("dtype, amx, env, want", [
    (torch.float32, False, None, "every"), (torch.bfloat16, False, None, "every"),
    (torch.float32, True, None, "every"),  # AMX tiles run bfloat16 only
    (torch.bfloat16, True, None, 16),
    (torch.bfloat16, False, "0", 0), (torch.float32, True, "300", 300)])
def test_rows_default_per_cpu(monkeypatch, dtype, amx, env, want):
    """int8 for every batch unless bfloat16 runs AMX tiles (then up to the 16 rows
    measured against them); VLLM_GGUF_INT8_MAX_M overrides either."""
    from engine.model_executor.layers.quantization import gguf_int8

    monkeypatch.setattr(ops, "amx_in_use", lambda: amx)
    if env is None:
        monkeypatch.delenv("VLLM_GGUF_INT8_MAX_M", raising=False)
    else:
        monkeypatch.setenv("VLLM_GGUF_INT8_MAX_M", env)
    got = gguf_int8.max_rows(dtype)
    assert got == (gguf_int8.EVERY_BATCH if want == "every" else want)
    if want == "every":
        assert got > 1 << 30  # no step has that many tokens
