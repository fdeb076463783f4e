"""`engine quantize`: a float checkpoint to a compressed-tensors one, by
round to nearest (no calibration data): W8A8 int8, weights symmetric per
output channel (scale = max|w[n, :]| / 127), activations dynamic per token at
run time; or W4A16, 4-bit weights symmetric per group of input channels
(scale = max|w| / 7.5 over the group, as compressed-tensors computes it, q in
[-8, 7]) packed 8 to an int32 ("pack-quantized"). The result is what
llm-compressor writes for that scheme and upstream vLLM loads; lm_head,
embeddings, norms, MoE routers and experts (which this engine runs float)
stay as they are, listed in the config's ignore (rtn_plan)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from engine.model_executor.layers.quantization.rtn_plan import plan

SCHEMES = ("w8a8", "w4a16")
#: W4A16's default group of input channels (llm-compressor's W4A16 preset)
GROUP_SIZE = 128


def quantization_config(ignore: tuple[str, ...] = (), scheme: str = "w8a8",
                        group_size: int = GROUP_SIZE, per_channel: tuple[str, ...] = ()) -> dict:
    """per_channel (w4a16): the layers whose inputs do not split into groups,
    quantized per output channel in a config group of their own (an exact
    name outranks "Linear", in upstream's matching and ours)."""
    int8 = dict(num_bits=8, type="int", symmetric=True, group_size=None, block_structure=None,
                actorder=None, observer_kwargs={})
    if scheme == "w4a16":
        def group(targets, size):
            return {"targets": targets, "format": "pack-quantized", "input_activations": None,
                    "output_activations": None,
                    "weights": {**int8, "num_bits": 4, "group_size": size, "dynamic": False,
                                "strategy": "group" if size else "channel", "observer": "minmax"}}

        groups = {"group_0": group(["Linear"], group_size)}
        if per_channel:
            groups["group_1"] = group(list(per_channel), None)
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed", "kv_cache_scheme": None,
                "ignore": ["lm_head", *ignore], "config_groups": groups}
    return {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "ignore": ["lm_head", *ignore],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "output_activations": None,
            "weights": {**int8, "strategy": "channel", "dynamic": False, "observer": "minmax"},
            "input_activations": {**int8, "strategy": "token", "dynamic": True,
                                  "observer": None},
        }},
    }


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] and float32 scales [N, 1]: w / scale rounded to nearest even."""
    w = w.float()
    scale = w.abs().amax(1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale


def quantize_weight_w4a16(w: torch.Tensor, group_size: int | None = GROUP_SIZE
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """weight_packed int32 [N, ceil(K/8)] (q + 8, k = 8i + j at bits 4j, zero
    past K) and weight_scale [N, K/group_size] ([N, 1] for group_size None: per
    channel) in w's dtype: per group, scale = max|w| / 7.5 rounded to w's
    dtype, q = round(w / scale) clamped to [-8, 7]."""
    n, k = w.shape
    group = group_size or k
    g = w.float().view(n, k // group, group)
    scale = (g.abs().amax(-1) / 7.5).to(w.dtype)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.zeros(n, -(-k // 8) * 8, dtype=torch.int64)
    q[:, :k] = torch.round(g / scale.float()[..., None]).clamp(-8, 7).view(n, k) + 8
    lanes = (q.view(n, -1, 8) << (torch.arange(8) * 4)).sum(-1)
    return torch.where(lanes >= 2 ** 31, lanes - 2 ** 32, lanes).to(torch.int32), scale


def quantize(src: Path, dst: Path, scheme: str = "w8a8", ignore: tuple[str, ...] = (),
             group_size: int = GROUP_SIZE) -> Path:
    """Write `src` quantized to the new folder `dst`; the layers named in
    `ignore` (checkpoint names, e.g. model.layers.0.mlp.down_proj) stay float.
    Everything is checked before anything is written."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
    if scheme == "w4a16" and (group_size <= 0 or group_size % 8):
        raise ValueError(f"--group-size {group_size}: give a positive multiple of 8 (128, 64, 32)")
    per_channel: list[str] = []  # w4a16 layers whose inputs do not split into groups
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{src} has no config.json; give the folder of a Hugging Face checkpoint")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("quantization_config"):
        raise ValueError(f"{src} is quantized already "
                         f"({cfg['quantization_config'].get('quant_method')})")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src} has no *.safetensors weights")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists and is not empty; give a new folder")
    keys: set[str] = set()
    for file in files:
        with safe_open(file, "pt") as f:
            keys.update(f.keys())
    layers = plan(src, keys, tuple(ignore))
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, "pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                t = f.get_tensor(key)
                layer = key[:-len(".weight")]
                quantized = key.endswith(".weight") and layer in layers.quantize
                if quantized and scheme == "w4a16":
                    if t.shape[1] % group_size:
                        per_channel.append(layer)
                    tensors[f"{layer}.weight_packed"], tensors[f"{layer}.weight_scale"] = \
                        quantize_weight_w4a16(t, None if layer in per_channel else group_size)
                    tensors[f"{layer}.weight_shape"] = torch.tensor(t.shape, dtype=torch.int64)
                elif quantized:
                    q, s = quantize_weight(t)
                    tensors[key], tensors[key[:-len("weight")] + "weight_scale"] = q, s
                else:
                    tensors[key] = t
    tmp = dst.with_name(dst.name + ".partial")  # nothing half-written at dst
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for extra in src.iterdir():  # tokenizer, generation config, chat template ...
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copy2(extra, tmp / extra.name)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg["quantization_config"] = quantization_config(layers.ignore, scheme, group_size,
                                                     tuple(sorted(per_channel)))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if dst.exists():
        dst.rmdir()
    tmp.rename(dst)
    return dst
