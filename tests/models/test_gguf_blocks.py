"""GGUF's quantized blocks on the wna16 kernels (engine.model_executor.layers.
quantization.gguf_blocks, .gguf): each type taken apart is bit for bit what
gguf.quants.dequantize gives, and a layer of it multiplies as that weight does,
on every compiled CPU code path this CPU runs, AMX tiles or not, float32 and
bfloat16, few rows (the kernel) and many (the dequantised panel)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_files import quantize
from test_ops import isa, tiles  # noqa: F401  (every test on each code path, AMX or not)

from engine import ops
from engine.model_executor.layers.linear import Linear
from engine.model_executor.layers.quantization.gguf import method_for
from engine.model_executor.layers.quantization.gguf_blocks import FORMS, dequantized, unpack


@pytest.fixture(autouse=True)
def float_x(monkeypatch):
    """x stays float at few rows too (the int8 decode rounds it:
    tests/models/test_gguf_int8.py): each layer multiplies as its weight does."""
    monkeypatch.setenv("VLLM_GGUF_INT8_MAX_M", "0")

gguf = pytest.importorskip("gguf", reason="gguf is a runtime requirement (requirements/common.txt)")

TYPES = list(FORMS)


def _weight(rows: int, cols: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1


def _reference(data, qtype: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", TYPES)
def test_unpacked_blocks_are_the_gguf_weight_bit_for_bit(qtype, isa):
    if isa not in ("none", ops.compiled_cpu_isas()[-1]):
        pytest.skip("no kernel runs here: on one code path is enough")
    rows, cols = 6, 512
    data = quantize(_weight(rows, cols, 1), qtype)
    # random bytes too: every bit pattern of q, scales and mins (fp16 scales kept finite)
    raw = np.random.default_rng(2).integers(0, 256, data.shape, dtype=np.uint8)
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][1])
    for at in {"Q6_K": (208,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q5_K": (0, 2)}.get(qtype, (0,)):
        blocks[:, at:at + 2] = np.full((len(blocks), 1), 0.01, np.float16).view(np.uint8)
    for d in (data, raw):
        assert torch.equal(dequantized(unpack(qtype, d, rows, cols)), _reference(d, qtype))


def _layer(parts: list[tuple[str, int]], cols: int, dtype, seed=0):
    """A fused Linear of parts (type, rows), its GGUF blocks loaded; and the float weight."""
    sizes = tuple(r for _, r in parts)
    layer = Linear(cols, sum(sizes), False, dtype, sizes if len(sizes) > 1 else None)
    unpacked, dense = [], []
    for i, (qtype, rows) in enumerate(parts):
        data = quantize(_weight(rows, cols, seed + i), qtype)
        unpacked.append(unpack(qtype, data, rows, cols))
        dense.append(_reference(data, qtype))
    method_for(unpacked).load(layer, unpacked)
    return layer, torch.cat(dense)


@pytest.mark.skipif(not ops.has_wna16_linear(), reason="no wna16 kernel in this build / CPU")
@pytest.mark.usefixtures("tiles")
# one type of each form (bits, group, zero point or min): Q5_0 and Q5_1 share Q8_0's and Q5_K's
@pytest.mark.parametrize("parts", [[(t, 40)] for t in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K",
                                                       "Q6_K")] + [
    [("Q4_K", 64), ("Q4_K", 32), ("Q6_K", 32)],  # a Q4_K_M file's q/k/v
    [("Q4_0", 48), ("Q8_0", 48)]], ids=lambda p: "+".join(t for t, _ in p))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 80])  # decode (the kernel), prefill (the large-M panel)
def test_layer_multiplies_as_the_dequantized_weight(parts, dtype, m):
    cols = 256
    layer, w = _layer(parts, cols, dtype)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = layer(x)
    exact = x.float() @ w.T
    if dtype == torch.float32:
        torch.testing.assert_close(out, exact, atol=2e-4, rtol=2e-4)
    else:  # x rounded already; the product (or the panel's weight) rounded once more
        bound = (x.float().abs() @ w.abs().T) * 2.0 ** -8 + exact.abs() * 2.0 ** -7 + 1e-3
        assert ((out.float() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mins_without_the_panel_kernel(dtype, isa, monkeypatch):
    """Where the code path has no panel GEMM (aarch64, the portable build) the
    mins' share is torch's product."""
    if isa not in ("none", ops.compiled_cpu_isas()[-1]):
        pytest.skip("torch's product: on one code path is enough")
    monkeypatch.setattr(ops, "has_panel_linear", lambda: False)
    layer, w = _layer([("Q4_K", 40)], 256, dtype)
    assert layer.gguf_mins is not None and layer.gguf_mins.dim() == 2
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4)).to(dtype)
    tol = dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(layer(x).float(), x.float() @ w.T, **tol)
