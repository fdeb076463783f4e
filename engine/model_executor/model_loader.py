"""Load a Hugging Face checkpoint's safetensors into a model, fusing q/k/v
and gate/up projections as the model expects (its checkpoint_map()).

Tensors are read with plain reads straight into the model's parameters, not
through a memory map: mapped checkpoint pages would count in the process's
memory next to the parameters (and the packed copies made at load), doubling
the peak for a large model."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.model_executor.layers.parallel import checkpoint_slice, stage_holds
from engine.model_executor.shard_reader import SAFETENSORS_DTYPES as _DTYPES
from engine.model_executor.shard_reader import read_slice_into

if TYPE_CHECKING:
    from engine.model_executor.models.weights import CausalLM

# Checkpoint tensors no model reads: rotary tables older exports saved.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# A quantized layer's tensors next to its weight (layers/quantization): fused
# and sliced as the weight's rows are.
_QUANT_SUFFIXES = (".weight_scale",)


def _header(f, name: str, size: int) -> dict:
    """The safetensors header: {tensor: {dtype, shape, data_offsets}}, checked
    against the file's size so that no read runs past it."""
    raw = f.read(8)
    if len(raw) < 8:
        raise ValueError(f"{name}: not a safetensors file (shorter than its header)")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
        raise ValueError(f"{name}: not a safetensors file (header of {n} bytes)")
    try:
        header = json.loads(f.read(n))
    except ValueError:
        raise ValueError(f"{name}: not a safetensors file (unreadable header)") from None
    base = 8 + n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= size - base:
            raise ValueError(f"{name}: {key} lies outside the file")
        info["data_offsets"] = (base + begin, base + end)
    header.pop("__metadata__", None)
    return header


def _read_into(f, name: str, key: str, info: dict, dest: torch.Tensor) -> None:
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"{name}: {key} has dtype {info['dtype']}; float32, bfloat16, float16, "
                         "float64 and (quantized checkpoints) int8 are supported")
    if (dtype == torch.int8) != (dest.dtype == torch.int8):
        raise ValueError(f"{name}: {key} has dtype {info['dtype']} where the model expects "
                         f"{dest.dtype}; does config.json's quantization_config match the weights?")
    shape = tuple(info["shape"])
    if shape != tuple(dest.shape):
        raise ValueError(f"{name}: {key} has shape {shape}, the model expects "
                         f"{tuple(dest.shape)}")
    begin, end = info["data_offsets"]
    if end - begin != dest.numel() * dtype.itemsize:
        raise ValueError(f"{name}: {key} holds {end - begin} bytes, not {shape} of {dtype}")
    # read straight into the parameter when its bytes are the file's and in host
    # memory; otherwise (another dtype, a strided view, a GPU) through one CPU buffer
    direct = dest.dtype == dtype and dest.is_contiguous() and dest.device.type == "cpu"
    target = dest if direct else torch.empty(shape, dtype=dtype)
    f.seek(begin)
    # numpy's stubs give ndarray __buffer__ only from Python 3.12; it is a buffer on all
    buf = memoryview(target.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    if f.readinto(buf) != len(buf):
        raise ValueError(f"{name}: {key} is cut short")
    if target is not dest:
        dest.copy_(target)


def load_weights(model: CausalLM, path: Path,
                 already_read: set[str] | frozenset[str] = frozenset()) -> None:
    """Read every tensor of the checkpoint into the model; refuse, in one line
    naming the tensor, one the model does not know, one whose shape does not
    fit, and a parameter (or one part of a fused one) the checkpoint lacks.

    The model names what it reads: checkpoint_map() gives each checkpoint
    tensor's (parameter, part) -- part None for a whole parameter, else the
    index into the parameter's `shard_sizes` rows (fused q/k/v, gate/up).
    already_read: tensors something else has read (weight-only quantized
    layers: engine.model_executor.layers.quantization.apply), left alone."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors weights")
    params = dict(model.named_parameters())
    mapping = {k: v for k, v in _with_quant_tensors(model.checkpoint_map(), params).items()
               if k not in already_read}
    skip = set(getattr(model, "skipped_checkpoint_keys", lambda: ())()) | set(already_read)
    # heads a pooling model does not run (an encoder's pretraining head)
    ignored = tuple(getattr(model, "ignored_checkpoint_prefixes", lambda: ())())
    loaded: dict[str, set] = {}
    with torch.no_grad():
        for file in files:
            with open(file, "rb", buffering=0) as f:
                header = _header(f, file.name, file.stat().st_size)
                for key, info in header.items():
                    if key in skip or key.endswith(_IGNORED_SUFFIXES) or \
                            (ignored and key.startswith(ignored)):
                        continue
                    if not stage_holds(model.config, key):  # another pipeline stage's
                        continue
                    if key not in mapping and key.endswith(_QUANT_SUFFIXES):
                        raise ValueError(f"{file.name}: {key} is a quantized layer's tensor, but "
                                         "config.json's quantization_config does not quantize "
                                         "that layer")
                    if key not in mapping:
                        raise ValueError(f"{file.name}: {key} is not a weight of "
                                         f"{type(model).__name__}; is config.json the "
                                         "checkpoint's own?")
                    name, part = mapping[key]
                    dest: torch.Tensor = params[name]
                    if part is not None:
                        bounds = _bounds(dest.shard_sizes)  # type: ignore[attr-defined]  # a fused one
                        dest = dest[bounds[part]:bounds[part + 1]]
                    rows = checkpoint_slice(model.config, key)  # tensor parallel: this rank's
                    if rows is None:
                        _read_into(f, file.name, key, info, dest)
                    else:
                        read_slice_into(f, file.name, key, info, dest, *rows)
                    loaded.setdefault(name, set()).add(part)
    for key, (name, part) in mapping.items():
        if part not in loaded.get(name, set()) and not _complete(params[name], loaded.get(name)):
            raise ValueError(f"{path}: the checkpoint lacks {key} (config.json asks for it); "
                             "the download may be incomplete")


def _with_quant_tensors(mapping: dict, params: dict) -> dict:
    """The map with each quantized weight's companions (its scale), which take
    the weight's part of a fused parameter: scales are per output row."""
    out = dict(mapping)
    for key, (name, part) in mapping.items():
        if not key.endswith(".weight"):
            continue
        for extra in _QUANT_SUFFIXES:
            companion = name[:-len(".weight")] + extra
            if companion in params:
                sizes = getattr(params[name], "shard_sizes", None)
                if sizes is not None:
                    params[companion].shard_sizes = sizes
                out[key[:-len(".weight")] + extra] = (companion, part)
    return out


def _bounds(sizes) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes) + 1)]


def _complete(param, got: set | None) -> bool:
    """Read whole, or every part of a fused parameter read."""
    sizes = getattr(param, "shard_sizes", None)
    if not got:
        return False
    return None in got or (sizes is not None and got >= set(range(len(sizes))))
