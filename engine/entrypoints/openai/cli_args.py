"""The `vllm serve` flags users copy into `engine serve` besides the engine's
own (upstream's vllm/entrypoints/openai/cli_args.py): each either does what
upstream's does, or, where this engine cannot, is refused by name in one
line that says why (check_args). Names and defaults are vLLM 0.32's."""
from __future__ import annotations

import argparse
import json

BOOL = argparse.BooleanOptionalAction

# flags this engine takes and honours (the engine's own are in engine/cli.py)
RESPONSE_ROLE = "assistant"  # upstream's --response-role default
GENERATION_CONFIG = "auto"  # upstream's --generation-config default
MAX_LOG_LEN = None  # --max-log-len: log whole prompts

# flag -> (values that are this engine's behaviour already, why others cannot be)
ONLY: dict[str, tuple[tuple, str]] = {
    "--kv-cache-dtype": (("auto",), "the KV cache is kept in the model's dtype"),
    "--load-format": (("auto", "safetensors"), "checkpoints are read from safetensors files"),
    "--tokenizer-mode": (("auto", "hf"), "the checkpoint's tokenizer.json is used"),
    "--scheduling-policy": (("fcfs",), "requests are scheduled first come, first served"),
    "--chat-template-content-format": (("auto", "string"),
                                      "message content parts are joined into one string"),
    "--model-impl": (("auto", "vllm"), "the engine's own model code runs"),
    "--lora-dtype": (("auto",), "adapters run in the model's dtype"),
}
# flag -> why this engine cannot honour it (refused whenever it is given)
REFUSED: dict[str, str] = {
    "--limit-mm-per-prompt": "this engine serves text models only",
    "--quantization": "the quantization is read from the checkpoint's config.json; leave it "
                      "unset",
    "--revision": "give a checkpoint folder or the default branch of a Hugging Face id",
    "--tokenizer-revision": "give a tokenizer folder with --tokenizer",
    "--hf-overrides": "edit the checkpoint's config.json instead",
    "--ssl-keyfile": "TLS is not served; put a TLS-terminating proxy in front",
    "--ssl-certfile": "TLS is not served; put a TLS-terminating proxy in front",
    "--middleware": "custom ASGI middleware is not loaded",
    "--headless": "the engine core and its API server start together",
    "--kv-transfer-config": "disaggregated prefill is not implemented",
    "--cpu-offload-gb": "weights stay in memory",
}
# flags whose effect is already this engine's only behaviour: taken, nothing to do
NO_OP_BOOLS = {
    "--disable-log-stats": "no periodic stats are logged; /metrics is always served",
    "--disable-uvicorn-access-log": "uvicorn's access log is off",
    "--disable-custom-all-reduce": "tensor parallel ranks all-reduce in shared memory",
}


def add_vllm_args(p: argparse.ArgumentParser) -> None:
    """The vLLM flags `engine serve` takes beside its own (engine/cli.py)."""
    g = p.add_argument_group("vLLM compatibility")
    g.add_argument("--trust-remote-code", action=BOOL, default=False,
                   help="taken as upstream's; the engine's own model code runs, never the "
                   "checkpoint's Python")
    g.add_argument("--seed", type=int, default=0,
                   help="seeds the sampler of requests without a seed of their own (default 0)")
    g.add_argument("--max-logprobs", type=int, default=None,
                   help="the most logprobs/top_logprobs/prompt_logprobs a request may ask for "
                   "(default 20; -1: the vocabulary)")
    g.add_argument("--generation-config", default=GENERATION_CONFIG, metavar="auto|vllm|DIR",
                   help="sampling defaults: auto, the checkpoint's generation_config.json; "
                   "vllm, none; DIR, that folder's generation_config.json")
    g.add_argument("--override-generation-config", type=_json_object, default=None,
                   metavar="JSON", help="sampling defaults over --generation-config's, "
                   "e.g. '{\"temperature\": 0.5}'")
    g.add_argument("--enable-log-requests", action=BOOL, default=False,
                   help="log each request's id, prompt and sampling parameters")
    g.add_argument("--max-log-len", type=int, default=MAX_LOG_LEN,
                   help="characters or ids of a prompt --enable-log-requests logs")
    g.add_argument("--response-role", default=RESPONSE_ROLE,
                   help="the role of chat answers when add_generation_prompt is true")
    g.add_argument("--return-tokens-as-token-ids", action=BOOL, default=False,
                   help="logprobs name tokens as 'token_id:N' (a request may ask too)")
    g.add_argument("--enable-request-id-headers", action=BOOL, default=False,
                   help="answer every request with an X-Request-Id header")
    g.add_argument("--disable-fastapi-docs", action=BOOL, default=False,
                   help="no /docs and no /openapi.json")
    g.add_argument("--root-path", default=None, help="the path prefix of a proxy in front")
    g.add_argument("--allowed-origins", type=json.loads, default=None,
                   help="CORS: origins allowed, a JSON list (default: no CORS headers)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="KV cache blocks, instead of sizing the cache from memory")
    for flag in NO_OP_BOOLS:
        g.add_argument(flag, action=BOOL, default=False, help=argparse.SUPPRESS)
    for flag in ONLY:
        g.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for flag in REFUSED:
        g.add_argument(flag, nargs="?", const=True, default=None, help=argparse.SUPPRESS)


def not_taken(extra: list[str]) -> str | None:
    """One line naming the first of `extra` (arguments the parser did not
    know) that is a `vllm serve` flag, else None (a typo: the parser's own
    error, with the nearest spelling)."""
    from engine.entrypoints.openai.vllm_serve_flags import VLLM_SERVE_FLAGS

    for word in extra:
        flag = word.split("=", 1)[0]
        if flag.startswith("--no-"):
            flag = "--" + flag[5:]
        if flag in VLLM_SERVE_FLAGS:
            return (f"{flag} is a `vllm serve` flag this engine does not implement; leave it "
                    "out (docs/serving.md#vllm-flags lists those it takes)")
    return None


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # upstream's --dtype spellings


def check_args(args) -> None:
    """ValueError (one line naming the flag) for a vLLM flag this engine
    cannot honour, as given; upstream's other spellings made this engine's."""
    args.dtype = DTYPE_ALIASES.get(args.dtype, args.dtype)
    for flag, why in REFUSED.items():
        if getattr(args, _dest(flag), None) is not None:
            raise ValueError(f"{flag} is not supported by this engine: {why}")
    for flag, (ok, why) in ONLY.items():
        value = getattr(args, _dest(flag), None)
        if value is not None and value not in ok:
            raise ValueError(f"{flag} {value}: not supported by this engine ({why}); use "
                             f"{' or '.join(ok)} or leave it unset")
    check_lora_args(args)
    if args.max_logprobs is not None and args.max_logprobs < -1:
        raise ValueError(f"--max-logprobs must be -1 (the vocabulary) or >= 0, got "
                         f"{args.max_logprobs}")
    if args.allowed_origins is not None and not (
            isinstance(args.allowed_origins, list)
            and all(isinstance(o, str) for o in args.allowed_origins)):
        raise ValueError("--allowed-origins must be a JSON list of strings, e.g. "
                         "'[\"https://example.com\"]'")


def check_lora_args(args) -> None:
    """The LoRA flags together (engine/lora): ValueError in one line."""
    from engine import envs

    if not getattr(args, "enable_lora", False):
        if getattr(args, "lora_modules", None):
            raise ValueError("--lora-modules serves adapters; add --enable-lora")
        return
    if getattr(args, "api_server_count", 1) > 1 and envs.allow_runtime_lora_updating():
        raise ValueError("VLLM_ALLOW_RUNTIME_LORA_UPDATING with --api-server-count > 1: each "
                         "API server would hold its own adapters; use --api-server-count 1")
