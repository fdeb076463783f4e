"""GPTQ's and AWQ's quantization_config (quant_method "gptq", "awq"), as
AutoGPTQ / GPTQModel and AutoAWQ write it: every linear layer whose qweight
the checkpoint holds runs as wna16 (4- or 8-bit GPTQ, sym or asym, desc_act
either way; 4-bit AWQ GEMM, with or without zero points)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.model_executor.layers.quantization.compressed_tensors import unsupported
from engine.model_executor.layers.quantization.wna16 import WNA16
from engine.model_executor.layers.quantization.wna16_formats import read_awq, read_gptq


def _group_size(path: str, qc: dict, key: str) -> int:
    g = qc.get(key, 128)
    if not isinstance(g, int) or not (g == -1 or g > 0):
        raise unsupported(path, f"group_size {g!r}")
    return g


@dataclass(frozen=True)
class _WeightOnly:
    """The layers whose qweight the checkpoint holds are quantized, alike."""
    method: WNA16
    keys: frozenset
    path: str

    def method_for(self, names: tuple[str, ...]) -> WNA16 | None:
        quantized = {n: f"{n}.qweight" in self.keys for n in names}
        if len(set(quantized.values())) > 1:
            raise ValueError(f"{self.path}: the checkpoint quantizes some of {', '.join(names)} "
                             "only, but this engine runs them as one fused layer; quantize "
                             "them alike")
        return self.method if quantized[names[0]] else None


def _keys(path) -> frozenset:
    from pathlib import Path

    from safetensors import safe_open

    keys = set()
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            keys.update(f.keys())
    return frozenset(keys)


@dataclass(frozen=True)
class GPTQConfig(_WeightOnly):
    group_size: int = 128
    zero_offset: int = 1

    @classmethod
    def parse(cls, qc: dict, path: str) -> GPTQConfig:
        bits = qc.get("bits")
        if bits not in (4, 8):
            raise unsupported(path, f"GPTQ with bits={bits!r} (4 and 8 run)")
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise unsupported(path, f"GPTQ checkpoint_format {fmt!r}")
        if qc.get("lm_head"):
            raise unsupported(path, "a GPTQ-quantized lm_head")
        if qc.get("dynamic"):
            raise unsupported(path, "GPTQ per-module overrides (dynamic)")
        group = _group_size(path, qc, "group_size")
        method = WNA16(bits, None if group == -1 else group, bool(qc.get("sym", True)))
        return cls(method, _keys(path), path, group, 1 if fmt == "gptq" else 0)

    def read_layer(self, r, name: str, method: WNA16, k: int) -> dict:
        return read_gptq(r, name, method.bits, self.group_size, method.symmetric,
                         self.zero_offset, k)


@dataclass(frozen=True)
class AWQConfig(_WeightOnly):
    group_size: int = 128

    @classmethod
    def parse(cls, qc: dict, path: str) -> AWQConfig:
        bits = qc.get("bits", qc.get("w_bit", 4))
        if bits != 4:
            raise unsupported(path, f"AWQ with bits={bits!r} (4 runs)")
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise unsupported(path, f"AWQ version {version!r} (GEMM packing runs)")
        group = _group_size(path, qc, "group_size" if "group_size" in qc else "q_group_size")
        method = WNA16(4, None if group == -1 else group, not qc.get("zero_point", True))
        return cls(method, _keys(path), path, group)

    def read_layer(self, r, name: str, method: WNA16, k: int) -> dict:
        return read_awq(r, name, self.group_size, not method.symmetric, k)
