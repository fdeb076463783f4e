"""A request's adapter (upstream's LoRARequest): its name, an id unique among
the adapters the engine has seen, and the folder it loads from."""
from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, array_like=True, frozen=True, gc=False):
    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:  # 0 is the base model's, as upstream
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_int_id must be >= 1, "
                             f"got {self.lora_int_id}")
