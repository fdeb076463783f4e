"""One tensor-parallel rank's part of a GGUF tensor, cut from the file's
blocks: the rows or columns layers/parallel.checkpoint_slice names. A block
lies within one row, so any rows are whole blocks; columns are whole blocks
only where both ends of the cut are multiples of the type's block (32 values
for Q4_0/Q8_0..., 256 for the K-quants). A cut inside a block has no exact
block form (one scale, and for some types one min, would serve two ranks'
values): the caller dequantizes that tensor and slices the floats."""
from __future__ import annotations

import numpy as np


def _block(data: np.ndarray, type_name: str) -> tuple[int, int]:
    """(values, entries of `data`) a block spans along a row: the reader gives
    F32/F16 data by element, every other type by byte."""
    if data.dtype != np.uint8:
        return 1, 1
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]


def block_size(type_name: str) -> int:
    """Values in one block of the type (1 for the float types)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]


def whole_blocks(type_name: str, cut: tuple[int, int, int] | None) -> bool:
    """Whether the cut (dim, start, end) of a tensor of this type falls between blocks."""
    if cut is None or cut[0] == 0:
        return True
    size = block_size(type_name)
    return cut[1] % size == 0 and cut[2] % size == 0


def block_slice(data: np.ndarray, type_name: str, dim: int, start: int,
                end: int) -> np.ndarray | None:
    """Rows (dim 0) or columns (dim 1) [start, end) of a tensor's data as the
    gguf reader gives it ([rows, bytes of a row] for block types), still in
    the file's blocks; None where the columns' cut falls inside blocks."""
    if dim == 0:
        return data[start:end]
    if not whole_blocks(type_name, (dim, start, end)):
        return None
    values, entries = _block(data, type_name)
    return data[:, start // values * entries:end // values * entries]


def pad_rows(data: np.ndarray, rows: int) -> np.ndarray:
    """data with zero rows after its own up to `rows` (the last rank's rows
    past the vocabulary): all-zero bytes are a zero weight in every block type
    the kernels hold (each value is a multiple of the block's zero scale)."""
    if data.shape[0] >= rows:
        return data
    pad = np.zeros((rows - data.shape[0], *data.shape[1:]), dtype=data.dtype)
    return np.concatenate([data, pad])
