"""compressed-tensors' quantization_config (what llm-compressor writes and
upstream vLLM loads): config_groups of weight and input-activation schemes,
each with the layers it targets, and an ignore list. This engine runs INT8
W8A8 from it (format "int-quantized"): int8 weights symmetric per output
channel, int8 activations dynamic per token; and weight-only W4A16 / W8A16
(format "pack-quantized", wna16): grouped or per channel, symmetric or not,
with or without act-order (weight_g_idx)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.model_executor.layers.quantization.w8a8 import W8A8Int8
from engine.model_executor.layers.quantization.wna16 import WNA16
from engine.model_executor.layers.quantization.wna16_formats import read_compressed_tensors

METHOD = "compressed-tensors"
SUPPORTED = ("compressed-tensors int-quantized W8A8 (int8 weights symmetric per channel; "
             "int8 activations symmetric, dynamic per token), compressed-tensors "
             "pack-quantized W4A16/W8A16 (grouped or per channel), GPTQ 4/8-bit, AWQ 4-bit GEMM")


def unsupported(path: str, what: str) -> ValueError:
    return ValueError(f"{path}: quantization_config: {what} is not supported; supported: "
                      f"{SUPPORTED}")


def _matches(name: str, pattern: str) -> bool:
    """compressed-tensors' target/ignore rule: "re:<regex>" or an exact layer
    name; "Linear" (a module class) matches every linear layer."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern in (name, "Linear")


@dataclass(frozen=True)
class _Group:
    targets: tuple[str, ...]
    method: W8A8Int8 | WNA16


def _weight_only(path: str, name: str, w: dict, fmt: str | None) -> WNA16:
    what = f"config group {name!r}: weight-only {w.get('num_bits')}-bit {w.get('type')}"
    if (w.get("num_bits"), w.get("type")) not in ((4, "int"), (8, "int")):
        raise unsupported(path, what)
    if fmt != "pack-quantized":
        raise unsupported(path, f"{what} in format {fmt!r} (pack-quantized runs)")
    strategy, group = w.get("strategy"), w.get("group_size")
    if w.get("dynamic") or strategy not in ("group", "channel") or (
            strategy == "group" and not (isinstance(group, int) and group > 0)):
        raise unsupported(path, f"{what} with strategy {strategy!r}, group_size {group!r}")
    return WNA16(w["num_bits"], group if strategy == "group" else None,
                 bool(w.get("symmetric", True)))


def _scheme(path: str, name: str, group: dict, fmt: str | None) -> W8A8Int8 | WNA16:
    w, a = group.get("weights"), group.get("input_activations")
    if not isinstance(w, dict):
        raise unsupported(path, f"config group {name!r} without weights")
    if not isinstance(a, dict):
        return _weight_only(path, name, w, group.get("format") or fmt)
    if (group.get("format") or fmt) != "int-quantized":
        raise unsupported(path, f"config group {name!r} of format "
                                f"{group.get('format') or fmt!r} with activations")
    for role, q in (("weights", w), ("input_activations", a)):
        if (q.get("num_bits"), q.get("type"), bool(q.get("symmetric", True))) != (8, "int", True):
            raise unsupported(path, f"config group {name!r}: {role} of {q.get('num_bits')}-bit "
                                     f"{q.get('type')}, symmetric={q.get('symmetric')}")
    # per-tensor weight scales and static activation scales: the kernel takes
    # them (engine.ops.int8_linear) but the loader does not fuse them yet
    if w.get("strategy") != "channel" or w.get("dynamic"):
        raise unsupported(path, f"config group {name!r}: weight strategy "
                                 f"{w.get('strategy')!r}")
    dynamic = bool(a.get("dynamic"))
    if (a.get("strategy"), dynamic) != ("token", True):
        raise unsupported(path, f"config group {name!r}: input activations with strategy "
                                 f"{a.get('strategy')!r}, dynamic={a.get('dynamic')}")
    return W8A8Int8(static_input=not dynamic)


@dataclass(frozen=True)
class CompressedTensorsConfig:
    groups: tuple[_Group, ...]
    ignore: tuple[str, ...]
    path: str

    @classmethod
    def parse(cls, qc: dict, path: str) -> CompressedTensorsConfig:
        fmt = qc.get("format")
        if fmt not in ("int-quantized", "pack-quantized", "mixed-precision"):
            raise unsupported(path, f"format {fmt!r}")
        groups = []
        for name, group in (qc.get("config_groups") or {}).items():
            groups.append(_Group(tuple(group.get("targets") or ()),
                                 _scheme(path, name, group, fmt)))
        if qc.get("kv_cache_scheme"):
            raise unsupported(path, "kv_cache_scheme (a quantized KV cache)")
        return cls(tuple(groups), tuple(qc.get("ignore") or ()), path)

    def read_layer(self, r, name: str, method: WNA16, k: int) -> dict:
        """A pack-quantized layer's tensors in wna16's form (wna16_formats.load)."""
        return read_compressed_tensors(r, name, method.bits, method.group_size, method.symmetric,
                                      k)

    def method_for(self, names: tuple[str, ...]) -> W8A8Int8 | WNA16 | None:
        """The method of a linear layer made of the checkpoint layers `names`
        (a fused one has several), None where it stays unquantized; the
        layers fused together must agree, as upstream requires."""
        chosen = {n: self._method_of(n) for n in names}
        if len(set(chosen.values())) > 1:
            raise ValueError(f"{self.path}: quantization_config treats {', '.join(names)} "
                             "differently, but this engine runs them as one fused layer; "
                             "quantize them alike")
        return chosen[names[0]]

    def _method_of(self, name: str) -> W8A8Int8 | WNA16 | None:
        if any(_matches(name, p) for p in self.ignore):
            return None
        # upstream's precedence: an exact name, then a "re:" pattern, then a class
        for kind in (lambda t: t == name, lambda t: t.startswith("re:"), lambda t: True):
            for g in self.groups:
                if any(kind(t) and _matches(name, t) for t in g.targets):
                    return g.method
        return None
