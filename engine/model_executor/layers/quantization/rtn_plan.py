"""Which layers `engine quantize` rounds and which it leaves float, read from
the engine's own model of the checkpoint (its linear layers and
checkpoint_map) rather than from layer names: so every architecture the engine
runs is quantized the way it is loaded, fused parts alike (OPT's q/k/v,
Phi-3's qkv_proj), and every linear layer left float is named in the config's
ignore. That matters because the config targets the class "Linear": a float
layer it does not list would be read as a quantized one, here and upstream."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model_executor.layers.quantization import checkpoint_names, unquantized_layers


@dataclass(frozen=True)
class Plan:
    quantize: frozenset[str]  # checkpoint layers to round (their .weight)
    ignore: tuple[str, ...]  # linear layers left float, for quantization_config's ignore


def plan(src: Path, keys: set[str], ignore: tuple[str, ...] = ()) -> Plan:
    """The plan for the checkpoint at `src` holding tensors `keys`; `ignore`
    (checkpoint layer names) stay float too. ValueError, one line, for an
    architecture the engine does not run or an ignore it could not load."""
    from engine.config import ModelConfig
    from engine.model_executor.layers.fused_moe import FusedMoE
    from engine.model_executor.layers.linear import Linear
    from engine.model_executor.models.registry import model_class

    c = ModelConfig.from_dir(src)
    with torch.device("meta"):  # names and shapes only: no memory for the weights
        model = model_class(c.architecture)(c, torch.float32)
    names = checkpoint_names(model, {k.rsplit(".", 1)[0] for k in keys})
    routers = unquantized_layers(model)
    quantize: set[str] = set()
    floats: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, Linear) or name == "lm_head" or name not in names:
            continue
        fused = names[name]
        left = [n for n in fused if n in ignore]
        if left and len(left) < len(fused):
            raise ValueError(f"ignore {', '.join(left)}: the engine runs {', '.join(fused)} as "
                             "one layer; ignore all of them or none")
        if name in routers:
            floats += fused
        elif not left:
            quantize.update(fused)
    known = {n for fused in names.values() for n in fused}
    unknown = [n for n in ignore if n not in known]
    if unknown:
        raise ValueError(f"ignore {unknown[0]}: not a linear layer of this {c.architecture} "
                         "checkpoint (give names like model.layers.0.mlp.down_proj)")
    lacking = sorted(n for n in quantize if f"{n}.weight" not in keys)
    if lacking:
        raise ValueError(f"{src}: the checkpoint lacks {lacking[0]}.weight, which "
                         f"{c.architecture} has")
    moe = {f"{m}.{p}" for m, mod in model.named_modules() if isinstance(mod, FusedMoE)
           for p, _ in mod.named_parameters(recurse=False)}
    experts = sorted({_experts(k) for k, (p, _) in model.checkpoint_map().items()
                      if p in moe and k in keys})
    return Plan(frozenset(quantize), tuple(dict.fromkeys((*floats, *ignore, *experts))))


def _experts(key: str) -> str:
    """A fused-MoE block's experts, which the engine runs float: one pattern
    a block (thousands of expert layers otherwise); upstream asks the ignore
    list about experts.0.gate_proj whatever the checkpoint calls them."""
    if ".experts." not in key:
        return key[:-len(".weight")]
    return "re:" + re.escape(key.split(".experts.")[0] + ".experts.")
