"""Request bodies of the OpenAI API as upstream vLLM serves them. A field the
engine implements is applied; one it does not (suffix, functions,
logits_processors, ...) is refused by name (400) when set to anything but its default, never
silently ignored; fields that change nothing about the answer (user,
metadata, ...) and unknown ones are ignored, as upstream ignores them.
Numbers and ids are strict: "1" is not an int, true is not a token id."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, StrictBool, StrictStr
from pydantic.config import JsonDict

from engine.entrypoints.openai.openapi_limits import CONTEXT, LOGPROBS, TOKEN_ID, TOKEN_ID_KEYS
from engine.sampling_params import (
    INT64_MAX,
    INT64_MIN,
    MAX_TEMPERATURE,
    SAMPLING_EPS,
    SamplingParams,
    with_model_defaults,
)

Seed = Field(default=None, ge=INT64_MIN, le=INT64_MAX)


def _no_bool(value):
    if isinstance(value, bool):  # pydantic's lax float takes true as 1.0; the schema does not
        raise ValueError("must be a number, not true or false")
    return value


Number = Annotated[float, BeforeValidator(_no_bool)]


def _whole(value):
    """JSON's integers: 3 and 3.0 (JSON Schema counts both), never true or "3"."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be an integer, not " + ("true or false" if isinstance(
            value, bool) else "a string"))
    if isinstance(value, (int, float)) and not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("must be an integer within 64 bits")  # 1e308, 10**30: no kernel's
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole)]
# what SamplingParams._verify and the server check, said in the schema too (its
# messages stay the checks' own): a body the schema allows is one the server takes
TokenId = Annotated[Int, Field(json_schema_extra=TOKEN_ID)]
Text = Annotated[StrictStr, Field(json_schema_extra={"minLength": 1})]  # non-empty


# SamplingParams' bounds of the fields the Responses API shares
TEMPERATURE: JsonDict = {"minimum": 0, "maximum": MAX_TEMPERATURE}
TOP_P: JsonDict = {"exclusiveMinimum": 0, "maximum": 1}
# a field upstream has and this engine refuses unless unset
REFUSED: JsonDict = {"anyOf": [{"type": "null"}],
                     "description": "not supported by this engine: leave unset"}


class StreamOptions(BaseModel):
    include_usage: StrictBool | None = True
    continuous_usage_stats: StrictBool | None = False


def _is_set(value, default) -> bool:
    return value is not None and value != default


# name -> the value that means "unset" (anything else is refused by name)
REFUSED_COMMON: dict[str, object] = {"logits_processors": None, "logprob_token_ids": None}


def when(field: str, value: JsonValue, then: JsonDict, required: bool = True) -> JsonDict:
    """A JSON Schema rule: with `field` set to `value`, the properties `then`
    hold (and are given, when `required`)."""
    return {"if": {"properties": {field: value}, "required": [field]},
            "then": {"properties": then, "required": list(then) if required else []}}


# _Sampling.check's rules, for the schema
SAMPLING_RULES: list[JsonValue] = [
    when("stream_options", {"type": "object"}, {"stream": {"const": True}}),
    when("stream", {"const": True}, {"prompt_logprobs": {"type": "null"}}, required=False)]


class _VllmFields(BaseModel):
    """vLLM's own request fields (upstream's protocol.py), applied as there."""

    best_of: Int | None = Field(default=None, ge=1)  # >= n; as upstream V1: n answers
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1)
    bad_words: list[StrictStr] | None = None
    truncate_prompt_tokens: Int | None = Field(  # -1: the context; 0 would leave nothing
        default=None, ge=-1, json_schema_extra={"not": {"const": 0}, **CONTEXT})
    return_tokens_as_token_ids: StrictBool | None = None  # None: --return-tokens-as-token-ids
    return_token_ids: StrictBool | None = None
    request_id: StrictStr | None = None  # else the X-Request-Id header's, else a random one
    use_beam_search: StrictBool = False  # n beams (serving_beam.py)
    length_penalty: Number = 1.0  # beam search's score: logprob / length ** length_penalty

    def vllm_fields(self) -> dict:
        """Their SamplingParams fields (bad_words are tokenized by the server)."""
        return {"allowed_token_ids": self.allowed_token_ids,
                "skip_special_tokens": self.skip_special_tokens}

    def check_vllm(self, n: int) -> None:
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens: 0 would leave no prompt; give -1 (the "
                             "model's context) or a count of at least 1")
        if self.best_of is not None and self.best_of < n:
            raise ValueError(f"best_of: must be >= n ({n}), got {self.best_of}")


class _Sampling(_VllmFields):
    model_config = ConfigDict(extra="allow",  # unknown fields are ignored (refused ones named)
                              json_schema_extra={"allOf": SAMPLING_RULES})

    model: StrictStr | None = None
    max_tokens: Int | None = Field(default=None, ge=1, json_schema_extra=CONTEXT)
    temperature: Number | None = Field(default=None, json_schema_extra=TEMPERATURE)
    top_p: Number | None = Field(default=None, json_schema_extra=TOP_P)
    top_k: Int | None = Field(default=None, json_schema_extra={"minimum": -1})
    min_p: Number | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": 1})
    seed: Int | None = Seed
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: StrictBool = False
    n: Int = Field(default=1, ge=1, le=128)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    min_tokens: Int = Field(default=0, ge=0)
    # None: the model's default
    presence_penalty: Number | None = Field(
        default=None, json_schema_extra={"minimum": -2, "maximum": 2})
    frequency_penalty: Number | None = Field(
        default=None, json_schema_extra={"minimum": -2, "maximum": 2})
    repetition_penalty: Number | None = Field(
        default=None, json_schema_extra={"exclusiveMinimum": 0})
    logit_bias: dict[str, float] | None = Field(default=None, json_schema_extra=TOKEN_ID_KEYS)
    prompt_logprobs: Int | None = Field(default=None, ge=0, json_schema_extra=LOGPROBS)
    response_format: dict | None = None
    user: StrictStr | None = None

    def unsupported(self) -> str | None:
        """The first field set that this engine does not implement."""
        extra = self.model_extra or {}
        for name, default in {**REFUSED_COMMON, **self.refused()}.items():
            value = extra.get(name, getattr(self, name, None))
            if _is_set(value, default):
                return name
        return None

    def refused(self) -> dict:
        return {}

    def check(self) -> None:
        """Cross-field rules upstream enforces (ValueError naming the field)."""
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only with stream=true")
        if self.prompt_logprobs is not None and self.stream:  # as upstream
            raise ValueError("prompt_logprobs: not available with stream=true")
        self.check_vllm(self.n)
        if (self.n > 1 and self.temperature is not None and self.temperature < SAMPLING_EPS
                and not self.use_beam_search):  # beam search: n beams, greedy or not
            raise ValueError(f"n must be 1 when using greedy sampling (temperature 0), "
                             f"got {self.n}")

    def num_logprobs(self) -> int | None:
        return None

    def logprob_asks(self) -> dict[str, int | None]:
        """The fields that ask for alternatives, by name (bounded by --max-logprobs)."""
        return {"prompt_logprobs": self.prompt_logprobs}

    def num_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    def logit_bias_ids(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        out = {}
        for key, bias in self.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                raise ValueError(f"logit_bias: keys are token ids, got {key!r}") from None
            out[token] = min(100.0, max(-100.0, bias))  # upstream clamps as OpenAI documents
        return out

    def sampling_params(self, max_tokens: int, index: int = 0,
                        model_defaults: dict | None = None) -> SamplingParams:
        """model_defaults: the checkpoint's generation_config.json fields, for
        those the request leaves unset (engine.sampling_params.with_model_defaults)."""
        seed = self.seed
        if seed is not None and seed != -1 and index:
            # n > 1: each choice its own stream of numbers, wrapped within int64
            seed = (seed + index - INT64_MIN) % 2**64 + INT64_MIN
        defaults = {k: v for k, v in (model_defaults or {}).items() if k != "max_tokens"}
        fields = with_model_defaults(
            {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
             "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
             "presence_penalty": self.presence_penalty,
             "frequency_penalty": self.frequency_penalty}, defaults)
        return SamplingParams(
            **fields, seed=seed, max_tokens=max_tokens,
            min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            logit_bias=self.logit_bias_ids(), logprobs=self.num_logprobs(),
            prompt_logprobs=self.num_prompt_logprobs(), **self.vllm_fields())


NonEmpty = Field(json_schema_extra={"minItems": 1})
Prompt = (Text | Annotated[list[Text], NonEmpty] | Annotated[list[TokenId], NonEmpty]
          | Annotated[list[Annotated[list[TokenId], NonEmpty]], NonEmpty])


class CompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra={"allOf": SAMPLING_RULES + [
        when("max_tokens", {"const": 0}, {"echo": {"const": True}})]})

    prompt: Prompt
    max_tokens: Int | None = Field(default=None, ge=0,  # 0: the prompt alone (echo)
                                   json_schema_extra=CONTEXT)
    echo: StrictBool | None = False
    logprobs: Int | None = Field(default=None, ge=0, json_schema_extra=LOGPROBS)
    suffix: StrictStr | None = Field(default=None, json_schema_extra=REFUSED)
    add_special_tokens: StrictBool = True

    def refused(self) -> dict:
        return {"suffix": None}

    def check(self) -> None:
        super().check()
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: must be at least 1 (0 only with echo, to score "
                             "the prompt alone)")

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def logprob_asks(self) -> dict[str, int | None]:
        return {"logprobs": self.logprobs, "prompt_logprobs": self.prompt_logprobs}

    def num_prompt_logprobs(self) -> int | None:
        """echo with logprobs: the prompt's too, as many alternatives (upstream)."""
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs

    def prompts(self) -> list:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]
        return list(p)


# shapes the server reads from free-form lists, said in the schema
TEXT_PART: JsonDict = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
FUNCTION_TOOL: JsonDict = {"type": "object", "required": ["function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "parameters": {"type": "object"}}}}}


TOOL_CHOICE: JsonDict = {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "null"}, {
    "type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"}, "function": {
            "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the template

    role: StrictStr
    content: StrictStr | Annotated[list[dict], Field(json_schema_extra={"items": TEXT_PART})] \
        | None = None


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra={"allOf": SAMPLING_RULES + [
        when("continue_final_message", {"const": True},
             {"add_generation_prompt": {"const": False}}),
        when("top_logprobs", {"type": "integer", "minimum": 1},
             {"logprobs": {"const": True}})]})

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1, json_schema_extra=CONTEXT)
    logprobs: StrictBool | None = False
    top_logprobs: Int | None = Field(default=None, ge=0, json_schema_extra=LOGPROBS)
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict | None = None
    tools: Annotated[list[dict], Field(json_schema_extra={"items": FUNCTION_TOOL})] | None = None
    # None: auto with tools, else none
    tool_choice: StrictStr | dict | None = Field(default=None, json_schema_extra=TOOL_CHOICE)
    parallel_tool_calls: StrictBool | None = True

    echo: StrictBool = False  # the last message first, when it is the answer's role
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False  # the template writes them

    def refused(self) -> dict:
        return {"functions": None, "function_call": None,
                "chat_template": None, "documents": None,
                "audio": None, "prediction": None}

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: only with logprobs=true")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message: not with add_generation_prompt=true; set "
                             "add_generation_prompt to false")

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def logprob_asks(self) -> dict[str, int | None]:
        return {"top_logprobs": self.top_logprobs, "prompt_logprobs": self.prompt_logprobs}

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
