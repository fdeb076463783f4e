"""`engine serve`: the OpenAI-compatible HTTP server."""
from __future__ import annotations

from engine.entrypoints.cli.args import (
    gguf_args,
    lora_args,
    parallel_args,
    positive,
    runner_args,
    scheduler_args,
    speculative_args,
)


def add_parser(sub) -> None:
    """`engine serve`."""
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument("model", help="a checkpoint folder, a .gguf file or a Hugging Face id "
                   "(org/name)")
    gguf_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16",
                                                       "half", "float"])  # vLLM's aliases
    s.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's)")
    s.add_argument("--max-num-seqs", type=int, default=256, help="sequences in one batch")
    s.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens in one step (default 2048 with chunked prefill; without it, "
                   "at least --max-model-len)")
    s.add_argument("--block-size", type=int, default=128)
    runner_args(s)
    scheduler_args(s)
    speculative_args(s)
    parallel_args(s)
    lora_args(s)
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use for the model (default: MODEL as given)")
    s.add_argument("--api-server-count", type=positive, default=1, metavar="N",
                   help="API server processes (HTTP, tokenization, detokenization) sharing "
                   "the port and the one engine core (default 1)")
    s.add_argument("--max-request-body-bytes", type=positive, default=None, metavar="N",
                   help="a larger request body is answered 413 before it is read (default: "
                   "sized for the model's context, at least 1 MiB)")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $VLLM_API_KEY)")
    s.add_argument("--stream-interval", default="auto", metavar="N|auto",
                   help="stream every N tokens as one event (1: every token, upstream's "
                   "default); auto (default): every token the engine sends, and a client "
                   "that fell behind gets what came meanwhile as one event")
    s.add_argument("--max-waiting-queue-length", type=positive, default=1024, metavar="N",
                   help="sequences (n x prompts per request) that may wait to run; a request "
                   "past it is answered 503 with Retry-After (default 1024)")
    s.add_argument("--chat-template", default=None,
                   help="a Jinja chat template file, instead of the model's")
    # structured outputs, tool calling, reasoning (upstream's flags)
    s.add_argument("--structured-outputs-config", default=None, metavar="JSON",
                   help='the grammar backend: \'{"backend": "xgrammar"}\' (the default; '
                   'also "disable_any_whitespace": true)')
    s.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='tool_choice "auto": the model decides, --tool-call-parser reads its calls')
    s.add_argument("--tool-call-parser", default=None, metavar="NAME",
                   help="how the model writes tool calls: hermes, llama3_json, llama4_json, "
                   "mistral, qwen3_coder, qwen3_xml, pythonic, or one --tool-parser-plugin "
                   "registers")
    s.add_argument("--tool-parser-plugin", default=None, metavar="FILE",
                   help="a Python file registering a tool parser "
                   "(@ToolParserManager.register_module(NAME))")
    s.add_argument("--reasoning-parser", default=None, metavar="NAME",
                   help="split a thinking model's answer into reasoning_content and content: "
                   "deepseek_r1, qwen3")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    from engine.entrypoints.openai.cli_args import add_vllm_args

    add_vllm_args(s)  # upstream's other flags: honoured, or refused by name


def serve(args) -> int:
    import logging

    from engine import envs
    from engine.entrypoints.openai.cli_args import check_args
    from engine.entrypoints.openai.serve import serve as run
    from engine.logger import init_logging

    check_args(args)

    init_logging(logging.INFO, "%(levelname)s %(asctime)s %(message)s")
    args.api_key = args.api_key or envs.api_key()
    return run(args)
