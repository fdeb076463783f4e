"""The models a server serves (upstream's serving_models.py): the base model's
names and, with --enable-lora, its adapters, from --lora-modules at start and
from /v1/load_lora_adapter and /v1/unload_lora_adapter when
VLLM_ALLOW_RUNTIME_LORA_UPDATING is set. An adapter is checked here when it is
added (a bad one is refused in one line); the engine core loads it at its
first request, by its path."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from pydantic import BaseModel

from engine.config import ModelConfig
from engine.lora.peft_helper import load_adapter
from engine.lora.request import LoRARequest


class LoadLoRAAdapterRequest(BaseModel):  # upstream's
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


@dataclass(frozen=True)
class LoRAModulePath:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModulePath:
    """One --lora-modules value: `name=path`, or upstream's JSON form
    '{"name": ..., "path": ..., "base_model_name": ...}'; ValueError in one line."""
    if text.lstrip().startswith("{"):
        try:
            d = json.loads(text)
            return LoRAModulePath(d["name"], d["path"], d.get("base_model_name"))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"--lora-modules {text!r}: the JSON form is "
                             '{"name": NAME, "path": DIR, "base_model_name": NAME}') from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {text!r}: give name=path (or upstream's JSON form)")
    return LoRAModulePath(name, path)


class LoRAModels:
    """The server's adapters by name, each with the id the engine knows it by."""

    def __init__(self, model: ModelConfig, max_lora_rank: int, base_names: list[str]):
        self.model, self.max_lora_rank, self.base_names = model, max_lora_rank, base_names
        self.requests: dict[str, LoRARequest] = {}
        self.parents: dict[str, str] = {}
        self._ids = itertools.count(1)

    def add(self, name: str, path: str, parent: str | None = None,
            replace: bool = False) -> LoRARequest:
        """Check the adapter against the model and serve it as `name` (replace:
        instead of the adapter of that name, under a new id so that the engine
        reads the new weights); ValueError in one line (a name taken, an
        adapter that does not fit: the one served stays)."""
        if (name in self.requests and not replace) or name in self.base_names:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")
        load_adapter(name, path, self.model, self.max_lora_rank)  # refused here, not mid-step
        req = LoRARequest(name, next(self._ids), str(path))
        self.requests[name] = req
        self.parents[name] = parent or self.base_names[0]
        return req

    def remove(self, name: str) -> None:
        """KeyError when no adapter has that name."""
        del self.requests[name]
        del self.parents[name]

    def cards(self) -> list[dict]:
        """/v1/models' entries of the adapters, as upstream's."""
        return [{"id": name, "object": "model", "root": r.lora_path,
                 "parent": self.parents[name], "owned_by": "vllm-engine"}
                for name, r in self.requests.items()]


def lora_models(args, model: ModelConfig, base_names: list[str]) -> LoRAModels | None:
    """The server's adapters from its flags (None without --enable-lora), each
    checked before the model loads (the flags themselves: cli_args.check_args);
    ValueError in one line."""
    from engine.lora.config import DEFAULT_MAX_LORA_RANK

    if not getattr(args, "enable_lora", False):
        return None
    models = LoRAModels(model, args.max_lora_rank or DEFAULT_MAX_LORA_RANK, base_names)
    for m in args.lora_modules or []:
        models.add(m.name, m.path, m.base_model_name)
    return models
