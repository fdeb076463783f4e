"""The engine's LoRA settings (upstream's LoRAConfig): how many adapters a step
may mix, their largest rank, how many stay loaded in memory."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_LORAS = 1  # upstream's defaults
DEFAULT_MAX_LORA_RANK = 16


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = DEFAULT_MAX_LORAS  # adapters one step may mix (the stacked slots)
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_cpu_loras: int | None = None  # adapters kept loaded; None: max_loras, as upstream

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras}): every active adapter is also loaded")

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


def lora_config(enable_lora: bool, max_loras: int | None, max_lora_rank: int | None,
                max_cpu_loras: int | None, ranks: int, runner: str) -> LoRAConfig | None:
    """The engine's LoRAConfig from its arguments (None without enable_lora);
    ValueError in one line for what it cannot run."""
    given = {k: v for k, v in (("max_loras", max_loras), ("max_lora_rank", max_lora_rank),
                               ("max_cpu_loras", max_cpu_loras)) if v is not None}
    if not enable_lora:
        return None
    if ranks != 1:
        raise ValueError("--enable-lora runs on one rank so far (adapters are not sharded "
                         "over tensor or pipeline ranks); use -tp 1 -pp 1")
    if runner != "generate":
        raise ValueError("--enable-lora serves generating models; leave it out with "
                         "--runner pooling")
    return LoRAConfig(**given)
