"""`engine quantize`: a float checkpoint to a compressed-tensors one, by
round to nearest (no calibration data): W8A8 int8, weights symmetric per
output channel (scale = max|w[n, :]| / 127), activations dynamic per token at
run time. The result is what llm-compressor writes for that scheme and
upstream vLLM loads; lm_head, embeddings and norms stay as they are."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

SCHEMES = ("w8a8",)
# the decoder's linear layers, as the checkpoint names them
_LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
                     r"\.weight$")


def quantization_config(ignore: tuple[str, ...] = ()) -> dict:
    int8 = dict(num_bits=8, type="int", symmetric=True, group_size=None, block_structure=None,
                actorder=None, observer_kwargs={})
    return {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None, "ignore": ["lm_head", *ignore],
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


def quantize(src: Path, dst: Path, scheme: str = "w8a8", ignore: tuple[str, ...] = ()) -> Path:
    """Write `src` quantized to the new folder `dst`; the layers named in
    `ignore` (checkpoint names, e.g. model.layers.0.mlp.down_proj) stay float."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
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
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, "pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                if _LINEAR.match(key) and key[:-len(".weight")] not in ignore:
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
    cfg["quantization_config"] = quantization_config(tuple(ignore))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if dst.exists():
        dst.rmdir()
    tmp.rename(dst)
    return dst
