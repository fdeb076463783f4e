"""Request bodies of the OpenAI API as far as the engine serves them. Fields the
engine cannot honour are refused by name (400) rather than silently ignored;
fields it has no use for (user, metadata, ...) are accepted and ignored."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling_params import SamplingParams, with_model_defaults


class StreamOptions(BaseModel):
    include_usage: bool = True
    continuous_usage_stats: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    # refused when set: the engine does not compute them
    logprobs: object = None
    logit_bias: dict | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0

    def unsupported(self) -> str | None:
        if self.logprobs not in (None, False, 0):
            return "logprobs"
        if self.logit_bias:
            return "logit_bias"
        if self.presence_penalty:
            return "presence_penalty"
        if self.frequency_penalty:
            return "frequency_penalty"
        return None

    def sampling_params(self, max_tokens: int, index: int = 0,
                        model_defaults: dict | None = None) -> SamplingParams:
        """model_defaults: the checkpoint's generation_config.json fields, for
        those the request leaves unset (engine.sampling_params.with_model_defaults)."""
        # n > 1 with a seed: each choice gets its own stream of random numbers
        seed = None if self.seed is None else self.seed + index
        fields = with_model_defaults(
            {"temperature": self.temperature, "top_p": self.top_p,
             "top_k": -1 if self.top_k == 0 else self.top_k,
             "repetition_penalty": self.repetition_penalty}, model_defaults or {})
        return SamplingParams(
            **fields, seed=seed, max_tokens=max_tokens, stop=self.stop,
            stop_token_ids=list(self.stop_token_ids or []), ignore_eos=self.ignore_eos)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False

    def prompts(self) -> list:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]
        return list(p)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the template

    role: str
    content: Union[str, list[dict], None] = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None
