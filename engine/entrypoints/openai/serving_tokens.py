"""Upstream's small routes beside the OpenAI API: /version, /load,
/tokenize and /detokenize (outside /v1, without the API key, as upstream's)."""
from __future__ import annotations

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from engine.entrypoints.openai.serving_engine import APIError, ServerState, json_body


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    tokens: list[StrictInt]


def add_token_routes(app: FastAPI, state: ServerState) -> None:
    vocab = state.llm.model_config.vocab_size

    def check_model(name: str | None) -> None:
        if name is not None and name not in state.model_names:
            raise APIError(404, f"The model `{name}` does not exist; this server serves "
                           f"{', '.join(state.model_names)}", "model")

    @app.get("/version")
    async def version():
        from engine import __version__

        return {"version": __version__}

    @app.get("/load")
    async def load():
        return {"server_load": state.llm.num_requests()}

    @app.post("/tokenize", dependencies=[Depends(json_body)])
    async def tokenize(body: TokenizeRequest):
        check_model(body.model)
        ids = await state.llm.tokenize(body.prompt, body.add_special_tokens)
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids,
                "token_strs": None}

    @app.post("/detokenize", dependencies=[Depends(json_body)])
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens: token ids must be in [0, {vocab}), got {bad[:5]}",
                           "tokens")
        return {"prompt": state.llm.detokenize(body.tokens)}
