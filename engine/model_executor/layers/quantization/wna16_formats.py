"""Weight-only 4/8-bit checkpoints in the layouts upstream vLLM loads, read
into wna16's one form (q [N, K] unsigned, scales and zeros [N, groups], the
group of each input channel) and packed for the kernel at load:

- compressed-tensors pack-quantized: weight_packed int32 [N, ceil(K/pf)], q + 2**(bits-1)
  along K, value i of each int32 at bits i*bits (pf = 32/bits); weight_scale
  [N, groups]; weight_zero_point int32 [ceil(N/pf), groups] packed so along N
  (asymmetric only, else 0); weight_shape [N, K]; weight_g_idx [K] (actorder);
- GPTQ: qweight int32 [K/pf, N] packed along K; scales [groups, N]; qzeros
  int32 [groups, N/pf] packed along N, holding zero - 1 (zero itself with
  checkpoint_format gptq_v2), ignored for symmetric ones (zero 2**(bits-1));
  g_idx [K] (desc_act: any order);
- AWQ (GEMM): qweight int32 [K, N/8] packed along N in the order 0 2 4 6 1 3 5 7;
  qzeros int32 [groups, N/8] alike, the zero itself; scales [groups, N].

An input-channel order other than k // group_size (act-order) becomes a
permutation the layer applies to its input, the weight's columns sorted by
group. The engine's loader then skips these tensors (skipped_checkpoint_keys).

With tensor parallel each rank reads a layer whole and keeps its slice
(engine.model_executor.layers.parallel.checkpoint_slice, as for float
weights): output rows of the column-parallel layers; input columns, and the
groups they hold, of the row-parallel ones (o_proj, down_proj), which must
split between groups (act-order: each rank's channels whole groups)."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.distributed.parallel_state import tp_size
from engine.model_executor.layers.parallel import checkpoint_slice

#: AWQ's GEMM packing: value i of an int32 is column AWQ_ORDER[i] of its 8
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_REVERSE = tuple(AWQ_ORDER.index(j) for j in range(8))  # column j is value _AWQ_REVERSE[j]


class Reader:
    """The checkpoint's tensors by name, across its safetensors files."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.files, self.where = [], {}
        for file in sorted(Path(path).glob("*.safetensors")):
            f = safe_open(file, "pt")
            self.files.append(f)
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                self.where[key] = f
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.where

    def layers(self) -> set[str]:
        """The layer each tensor belongs to (its name less the last part)."""
        return {key.rsplit(".", 1)[0] for key in self.where}

    def require(self, key: str) -> None:
        """A quantized layer's tensor the config asks for; ValueError naming
        the layer's real state when the checkpoint lacks it."""
        if key in self.where:
            return
        layer = key.rsplit(".", 1)[0]
        why = (f"tensor {key} is missing from the quantized checkpoint "
               f"(config.json's quantization_config quantizes {layer})")
        weight = f"{layer}.weight"
        if weight in self.where:  # a layer the quantizer left float but did not list
            dtype = self.where[weight].get_slice(weight).get_dtype()
            raise ValueError(f"{why}; the checkpoint holds {weight} unquantized ({dtype}), so "
                             "the quantization_config must leave that layer out (ignore)")
        raise ValueError(why)

    def get(self, key: str) -> torch.Tensor:
        self.require(key)
        self.read.add(key)
        return self.where[key].get_tensor(key)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, order=None,
                 dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """int32 [R, C] -> `dtype` values, 32/bits each along `dim` ([R, C*pf] or
    [R*pf, C]): value i at bits i*bits, unsigned; order[j]: the value that is
    element j (AWQ's), else value i is element i. One value at a time, so that
    a weight's transients stay a fraction of it (uint8 q: 1 byte a value)."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"a packed tensor must be 2-D int32, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    pf = 32 // bits
    r, c = packed.shape
    v = torch.empty(r, c, pf, dtype=dtype)
    for j in range(pf):
        i = j if order is None else order[j]
        v[..., j] = (packed >> (i * bits)) & ((1 << bits) - 1)
    return v.view(r, c * pf) if dim == 1 else v.permute(0, 2, 1).reshape(r * pf, c)


def _check(name: str, what: str, t: torch.Tensor, shape: tuple) -> torch.Tensor:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}.{what} has shape {tuple(t.shape)}, the model expects "
                         f"{tuple(shape)}")
    return t


def read_compressed_tensors(r: Reader, name: str, bits: int, group_size: int | None,
                            symmetric: bool, k: int) -> dict:
    n, k_ckpt = (int(v) for v in r.get(f"{name}.weight_shape").tolist())
    if k_ckpt != k:
        raise ValueError(f"{name}.weight_shape says {k_ckpt} inputs, the model expects {k}")
    group = group_size or k
    groups, pf = -(-k // group), 32 // bits
    packed = _check(name, "weight_packed", r.get(f"{name}.weight_packed"), (n, -(-k // pf)))
    q = unpack_int32(packed, bits, 1, dtype=torch.uint8)[:, :k]
    scales = _check(name, "weight_scale", r.get(f"{name}.weight_scale"), (n, groups))
    if symmetric:
        zeros = torch.full((n, groups), 1 << (bits - 1), dtype=torch.int32)
    else:
        zp = _check(name, "weight_zero_point", r.get(f"{name}.weight_zero_point"),
                    (-(-n // pf), groups))
        zeros = unpack_int32(zp, bits, 0)[:n]  # zero + 2**(bits-1), as q
    g_idx = r.get(f"{name}.weight_g_idx") if r.has(f"{name}.weight_g_idx") else None
    return dict(q=q, scales=scales, zeros=zeros, g_idx=g_idx, group=group)


def read_gptq(r: Reader, name: str, bits: int, group_size: int, symmetric: bool,
              zero_offset: int, k: int) -> dict:
    pf = 32 // bits
    qweight = r.get(f"{name}.qweight")
    n = qweight.shape[1]
    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    q = unpack_int32(_check(name, "qweight", qweight, (-(-k // pf), n)), bits, 0,
                     dtype=torch.uint8)[:k].T
    scales = _check(name, "scales", r.get(f"{name}.scales"), (groups, n)).T
    if symmetric:  # as vLLM: the stored zeros are not read
        zeros = torch.full((n, groups), 1 << (bits - 1), dtype=torch.int32)
        if r.has(f"{name}.qzeros"):
            r.read.add(f"{name}.qzeros")
    else:
        qz = _check(name, "qzeros", r.get(f"{name}.qzeros"), (groups, -(-n // pf)))
        zeros = unpack_int32(qz, bits, 1)[:, :n].T + zero_offset
    g_idx = r.get(f"{name}.g_idx") if r.has(f"{name}.g_idx") else None
    return dict(q=q, scales=scales, zeros=zeros, g_idx=g_idx, group=group)


def read_awq(r: Reader, name: str, group_size: int, zero_point: bool, k: int) -> dict:
    qweight = r.get(f"{name}.qweight")
    n = qweight.shape[1] * 8
    group = k if group_size == -1 else group_size
    groups = -(-k // group)
    q = unpack_int32(_check(name, "qweight", qweight, (k, n // 8)), 4, 1, _AWQ_REVERSE,
                     dtype=torch.uint8).T
    scales = _check(name, "scales", r.get(f"{name}.scales"), (groups, n)).T
    if zero_point:
        qz = _check(name, "qzeros", r.get(f"{name}.qzeros"), (groups, n // 8))
        zeros = unpack_int32(qz, 4, 1, _AWQ_REVERSE).T
    else:  # AutoAWQ's GEMM layers hold a qzeros buffer even so: not read
        zeros = torch.full((n, groups), 8, dtype=torch.int32)
        if r.has(f"{name}.qzeros"):
            r.read.add(f"{name}.qzeros")
    return dict(q=q, scales=scales, zeros=zeros, g_idx=None, group=group)


def _input_order(name: str, g_idx: torch.Tensor | None, k: int, group: int):
    """None when input channel k is in group k // group; else the order that
    sorts the channels by group, checked to give every group its size."""
    if g_idx is None:
        return None
    g_idx = g_idx.long().reshape(-1)
    if g_idx.numel() != k:
        raise ValueError(f"{name}.g_idx has {g_idx.numel()} entries, the layer {k} inputs")
    if torch.equal(g_idx, torch.arange(k) // group):
        return None
    groups = -(-k // group)
    want = torch.tensor([min(group, k - g * group) for g in range(groups)])
    if g_idx.min() < 0 or g_idx.max() >= groups or not torch.equal(
            torch.bincount(g_idx, minlength=groups), want):
        raise ValueError(f"{name}.g_idx does not put {group} input channels in each group; "
                         "this engine runs act-order checkpoints with whole groups only")
    return torch.sort(g_idx, stable=True).indices


def _rank_part(name: str, part: dict, sl: tuple[int, int, int] | None) -> dict:
    """This rank's slice (checkpoint_slice's (dim, start, end)) of a layer read whole."""
    if sl is None:
        return part
    dim, start, end = sl
    q, scales, zeros, g_idx, group = (part[x] for x in ("q", "scales", "zeros", "g_idx", "group"))
    if dim == 0:
        return {**part, "q": q[start:end], "scales": scales[start:end], "zeros": zeros[start:end]}
    k = q.shape[1]
    if group >= k:  # per channel: every rank keeps the one group
        return {**part, "q": q[:, start:end], "group": end - start, "g_idx": None}
    if _input_order(name, g_idx, k, group) is None:  # channel k in group k // group
        if start % group:
            raise ValueError(f"{name}: {end - start} input channels a rank split its groups of "
                             f"{group}; run with a tensor_parallel_size that divides them")
        keep = torch.arange(start // group, -(-end // group))
        local_idx = None
    else:  # act-order: the groups of this rank's channels, each whole, renumbered
        mine = g_idx.long().reshape(-1)[start:end]
        keep = mine.unique()
        if not torch.equal(torch.bincount(mine, minlength=scales.shape[1])[keep],
                           torch.bincount(g_idx.long().reshape(-1))[keep]):
            raise ValueError(f"{name}: act-order (g_idx) puts a group's input channels on "
                             "several tensor parallel ranks; run it with tensor_parallel_size 1")
        local_idx = torch.searchsorted(keep, mine)
    return {**part, "q": q[:, start:end], "scales": scales[:, keep], "zeros": zeros[:, keep],
            "g_idx": local_idx}


def load(r: Reader, config, layers: list, model_config) -> set[str]:
    """Read, repack and set the weights of `layers` ((module, checkpoint names
    of its fused parts, WNA16 method) each) with config.read_layer, each rank
    its slice; returns the checkpoint keys read, for the engine's loader to skip."""
    for module, names, method in layers:
        k = module.in_features
        parts = []
        for n in names:
            sl = checkpoint_slice(model_config, f"{n}.weight")
            full_k = k * tp_size() if sl is not None and sl[0] == 1 else k
            parts.append(_rank_part(n, config.read_layer(r, n, method, full_k), sl))
        first = parts[0]
        orders = {None if p["g_idx"] is None else tuple(p["g_idx"].tolist()) for p in parts}
        if len(orders) > 1:
            raise ValueError(f"{', '.join(names)} are fused into one layer here but their g_idx "
                             "(act-order) differ; this engine needs them alike")
        q = torch.cat([p["q"] for p in parts])
        zeros = torch.cat([p["zeros"] for p in parts])
        scales = torch.cat([p["scales"].float() for p in parts])
        if q.shape[0] != module.out_features:
            raise ValueError(f"{', '.join(names)}: {q.shape[0]} output channels in the "
                             f"checkpoint, the model expects {module.out_features}")
        if zeros.max() > 255:
            raise ValueError(f"{names[0]}: a zero point of {int(zeros.max())} (GPTQ's "
                             "zero - 1 of 0?) does not fit 8 bits")
        perm = _input_order(names[0], first["g_idx"], k, first["group"])
        if perm is not None:
            q = q[:, perm]
        pf = 32 // method.bits
        group = -(-first["group"] // pf) * pf if first["group"] >= k else first["group"]
        if group % pf:
            raise ValueError(f"{names[0]}: group size {group} is not a multiple of {pf}; "
                             f"{method.bits}-bit groups of 32, 64, 128 ... or per channel run")
        method.set_weights(module, q, scales, zeros.to(torch.uint8), perm, group)
    return r.read
