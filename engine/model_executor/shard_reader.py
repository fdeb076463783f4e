"""Read one rank's slice of a safetensors tensor straight from the file:
rows [start, end) of dim 0 in one read, or columns [start, end) of a 2-D
tensor one row segment at a time; the rest of the tensor is never read."""
from __future__ import annotations

import torch

#: safetensors dtype names this engine reads (int8: quantized checkpoints)
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F64": torch.float64, "I8": torch.int8}


def read_slice_into(f, name: str, key: str, info: dict, dest: torch.Tensor, dim: int,
                    start: int, end: int) -> None:
    dtype = SAFETENSORS_DTYPES.get(info["dtype"])
    if dtype is None or (dtype == torch.int8) != (dest.dtype == torch.int8):
        raise ValueError(f"{name}: {key} has dtype {info['dtype']} where the model expects "
                         f"{dest.dtype}")
    shape = list(info["shape"])
    begin, stop = info["data_offsets"]
    numel = 1
    for n in shape:
        numel *= n
    if stop - begin != numel * dtype.itemsize:
        raise ValueError(f"{name}: {key} holds {stop - begin} bytes, not {shape} of {dtype}")
    if dim >= len(shape) or end > shape[dim]:
        raise ValueError(f"{name}: {key} has shape {tuple(shape)}, too small for this rank's "
                         f"slice {start}:{end} of dim {dim}")
    want = shape[:dim] + [end - start] + shape[dim + 1:]
    rows = want[0]
    if dim == 0 and dest.shape[0] > rows:  # the last rank's padded vocabulary rows
        dest[rows:].zero_()
        dest = dest[:rows]
    if list(dest.shape) != want:
        raise ValueError(f"{name}: {key} sliced to {tuple(want)} for this rank, the model "
                         f"expects {tuple(dest.shape)}")
    target = dest if dest.dtype == dtype and dest.is_contiguous() else torch.empty(
        want, dtype=dtype)
    flat = target.view(-1).view(torch.uint8).numpy()
    item = dtype.itemsize
    if dim == 0:
        row = numel // shape[0] * item if shape[0] else 0
        # numpy's stubs give ndarray __buffer__ only from Python 3.12; it is a buffer on all
        _read(f, name, key, begin + start * row, memoryview(flat))  # type: ignore[arg-type]
    else:
        cols, seg = shape[1], (end - start) * item
        for r in range(shape[0]):
            _read(f, name, key, begin + (r * cols + start) * item,
                  memoryview(flat[r * seg:(r + 1) * seg]))  # type: ignore[arg-type]  # as above
    if target is not dest:
        dest.copy_(target)


def _read(f, name: str, key: str, offset: int, buf: memoryview) -> None:
    f.seek(offset)
    if f.readinto(buf) != len(buf):
        raise ValueError(f"{name}: {key} is cut short")
