"""The run-time adapter routes, upstream's /v1/load_lora_adapter and
/v1/unload_lora_adapter (api_server adds them only when
VLLM_ALLOW_RUNTIME_LORA_UPDATING is set)."""
from __future__ import annotations

from engine.entrypoints.openai.serving_engine import APIError
from engine.entrypoints.openai.serving_models import (
    LoadLoRAAdapterRequest,
    LoRAModels,
    UnloadLoRAAdapterRequest,
)


def add_lora_routes(app, state, deps: list) -> None:
    """/v1/load_lora_adapter and /v1/unload_lora_adapter (upstream's shapes and
    answers); the caller adds them only when VLLM_ALLOW_RUNTIME_LORA_UPDATING
    is set, as upstream."""
    from fastapi.responses import PlainTextResponse

    models: LoRAModels = state.lora

    @app.post("/v1/load_lora_adapter", dependencies=deps, response_class=PlainTextResponse)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest):
        if not body.lora_name or not body.lora_path:
            raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                           "lora_name" if not body.lora_name else "lora_path")
        try:
            models.add(body.lora_name, body.lora_path, replace=body.load_inplace)
        except ValueError as exc:
            raise APIError(400, str(exc), "lora_path" if "loaded" not in str(exc)
                           else "lora_name") from None
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", dependencies=deps, response_class=PlainTextResponse)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest):
        try:
            models.remove(body.lora_name)
        except KeyError:
            raise APIError(404, f"The lora adapter '{body.lora_name}' cannot be found.",
                           "lora_name") from None
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
