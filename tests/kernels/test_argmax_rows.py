"""Greedy sampling's argmax (ops.argmax_rows): torch.max's first index of
each row's maximum, a NaN counting as the maximum, over float32 and bfloat16
logits in place; wrong arguments refused in one line."""
from __future__ import annotations

import pytest
import torch

import engine
from engine import ops

pytestmark = pytest.mark.skipif(
    not engine.BUILD_INFO.has_kernels or engine.BUILD_INFO.device != "cpu",
    reason="argmax_rows is a CPU kernel; this build has none")
DTYPES = [torch.float32, torch.bfloat16]


def _want(x: torch.Tensor) -> list[int]:
    return torch.max(x.float(), dim=-1).indices.tolist()


def _kernel(x: torch.Tensor) -> list[int]:
    out = torch.empty(x.shape[0], dtype=torch.long)
    torch.ops._C.argmax_rows(out, x)
    return out.tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 49152), (16, 49152), (3, 1), (5, 1023),
                                        (2, 1025), (7, 151936), (64, 2006)])
def test_random_rows_equal_torch_max(dtype, rows, vocab):
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows * vocab)).to(dtype)
    assert _kernel(x) == _want(x)
    assert ops.argmax_rows(x) == _want(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_nans_and_infinities(dtype):
    V = 3000  # the maximum in a later block than the first, ties across blocks
    x = torch.full((6, V), -1.0)
    x[0, 1500] = x[0, 2500] = 7.0  # a tie: the first
    x[1, :] = float("-inf")  # every token masked: 0, as torch.max
    x[2, 2047], x[2, 10] = float("nan"), 100.0  # a NaN anywhere wins
    x[3, 5], x[3, 2900] = float("nan"), float("nan")  # the first NaN
    x[4, 2999] = float("inf")
    x[5, 1024] = 0.5  # the first token of a block
    x = x.to(dtype)
    assert _kernel(x) == _want(x) == [1500, 0, 2047, 5, 2999, 1024]


def test_rows_of_a_wider_tensor_are_read_in_place():
    base = torch.randn(4, 700).bfloat16()
    view = base[:, 100:600]  # row stride 700, last dimension contiguous
    assert _kernel(view) == _want(view)


@pytest.mark.parametrize("bad,match", [
    (lambda: (torch.empty(2, dtype=torch.long), torch.randn(2, 8).half()), "float32 and bfloat16"),
    (lambda: (torch.empty(3, dtype=torch.long), torch.randn(2, 8)), "out must have 2"),
    (lambda: (torch.empty(2, dtype=torch.int32), torch.randn(2, 8)), "dtype Long"),
    (lambda: (torch.empty(2, dtype=torch.long), torch.randn(8, 2).t()), "contiguous last"),
    (lambda: (torch.empty(2, dtype=torch.long), torch.randn(2, 0)), "at least one column"),
])
def test_bad_arguments_are_one_line(bad, match):
    out, x = bad()
    with pytest.raises((ValueError, TypeError), match=match) as info:
        torch.ops._C.argmax_rows(out, x)
    assert "\n" not in str(info.value).split("Exception raised from")[0].strip()


def test_other_dtypes_fall_back_to_torch():
    x = torch.randn(3, 50).half()
    assert ops.argmax_rows(x) == _want(x)
