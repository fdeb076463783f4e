"""Multi-LoRA serving (upstream's vllm/lora): many PEFT adapters over one base
model, mixed with base-model requests in one step."""
from engine.lora.request import LoRARequest

__all__ = ["LoRARequest"]
