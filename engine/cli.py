"""The `engine` command: generate, bench, env, serve, chat, complete,
make-tiny-model, quantize. Heavy modules (torch, FastAPI) are imported by the command
that needs them, so that `engine --help` stays fast."""
from __future__ import annotations

import argparse
import signal
import sys
import time


def _llm(args):
    from engine.engine_args import cli_engine_args
    from engine.entrypoints.llm import LLM

    return LLM(model=args.model, dtype=args.dtype, **cli_engine_args(args))


def tiny_model_archs() -> list[str]:
    # no torch at import: `engine --help` stays fast
    from engine.tiny_model import ARCHS
    from engine.tiny_pooling_model import POOLING_ARCHS

    return [*ARCHS, *POOLING_ARCHS]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a Hugging Face checkpoint folder or a "
                   ".gguf file")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    gguf_args(p)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    scheduler_args(p)
    speculative_args(p)
    parallel_args(p)


def gguf_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a folder with the tokenizer.json (and chat template) to use instead "
                   "of the model's (a GGUF file's: instead of the one in the file)")
    p.add_argument("--hf-config-path", default=None, metavar="DIR",
                   help="a GGUF model's config: a folder with config.json (default: the "
                   "file's metadata)")


def runner_args(p: argparse.ArgumentParser) -> None:
    from engine.pooler_config import CONVERTS, RUNNERS

    p.add_argument("--runner", default="auto", choices=RUNNERS,
                   help="generate, or pooling: embeddings, classes, scores (default auto: "
                   "pooling for encoders such as BERT, generate for decoders)")
    p.add_argument("--convert", default="auto", choices=CONVERTS,
                   help="what a pooling model serves: embed, classify or score (a "
                   "cross-encoder's); default auto: from its architecture")


def scheduler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="prefill long prompts in chunks of the step's token "
                   "budget while the running sequences decode (default: on)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None, help="reuse the KV blocks of a prompt prefix computed before "
                   "(default: on)")


def speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative-config", type=_speculative_config, default=None,
                   metavar="JSON", help='speculative decoding, e.g. \'{"method": "ngram", '
                   '"num_speculative_tokens": 4, "prompt_lookup_max": 5}\' (default: none)')


def _speculative_config(text: str) -> dict:
    """The flag's JSON, checked before anything loads (one line naming the key)."""
    import json

    from engine.spec_decode.config import SpeculativeConfig

    try:
        SpeculativeConfig.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return json.loads(text)


def lora_args(p: argparse.ArgumentParser) -> None:
    from engine.lora.config import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS

    p.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters over the model (docs/lora.md)")
    p.add_argument("--lora-modules", nargs="+", type=_lora_module, default=None,
                   metavar="NAME=DIR", help="adapters served by name at start: name=path, or "
                   '\'{"name": ..., "path": ..., "base_model_name": ...}\'')
    p.add_argument("--max-loras", type=int, default=None,
                   help=f"adapters one step may mix (default {DEFAULT_MAX_LORAS})")
    p.add_argument("--max-lora-rank", type=int, default=None,
                   help=f"the largest adapter rank (default {DEFAULT_MAX_LORA_RANK})")
    p.add_argument("--max-cpu-loras", type=int, default=None,
                   help="adapters kept loaded in memory (default: --max-loras)")


def _lora_module(text: str):
    from engine.entrypoints.openai.serving_models import parse_lora_module

    try:
        return parse_lora_module(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="the share of GPU memory the engine may take, KV cache included "
                   "(CUDA builds; default 0.9, upstream's); the CPU's cache is "
                   "VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="ranks the model is split over (one process each; pin them with "
                   "VLLM_CPU_OMP_THREADS_BIND='0-31|32-63')")
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1,
                   help="stages the model's layers are split in (one process each)")
    p.add_argument("-dp", "--data-parallel-size", type=int, default=1,
                   help="engine replicas (one process each, requests to the least loaded; "
                   "VLLM_CPU_OMP_THREADS_BIND names a list per rank, replica after replica)")
    p.add_argument("--distributed-executor-backend", default=None, choices=["mp", "ray"],
                   help="mp: processes on this machine (default with -tp > 1); ray: a Ray "
                   "cluster ($RAY_ADDRESS or a local one)")


def generate(args) -> int:
    from engine.sampling_params import SamplingParams

    llm = _llm(args)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed, max_tokens=args.max_tokens, stop=args.stop or None,
                            ignore_eos=args.ignore_eos)
    for out in llm.generate(args.prompt, params):
        print(out.outputs[0].text)
    return 0


def bench(args) -> int:
    """Throughput on synthetic prompts: tokens generated per second."""
    import torch

    from engine.sampling_params import SamplingParams

    llm = _llm(args)
    g = torch.Generator().manual_seed(0)
    vocab = llm.core.config.vocab_size
    prompts = [torch.randint(3, vocab, (args.input_len,), generator=g).tolist()
               for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"{args.num_prompts} requests x {args.output_len} tokens: {n} tokens in {dt:.2f} s = "
          f"{n / dt:.1f} tokens/s")
    return 0


def _serve_parser(sub) -> None:
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
    s.add_argument("--api-server-count", type=_positive, default=1, metavar="N",
                   help="API server processes (HTTP, tokenization, detokenization) sharing "
                   "the port and the one engine core (default 1)")
    s.add_argument("--max-request-body-bytes", type=_positive, default=None, metavar="N",
                   help="a larger request body is answered 413 before it is read (default: "
                   "sized for the model's context, at least 1 MiB)")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $VLLM_API_KEY)")
    s.add_argument("--stream-interval", default="auto", metavar="N|auto",
                   help="stream every N tokens as one event (1: every token, upstream's "
                   "default); auto (default): every token the engine sends, and a client "
                   "that fell behind gets what came meanwhile as one event")
    s.add_argument("--max-waiting-queue-length", type=_positive, default=1024, metavar="N",
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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _client_parser(sub, name: str, help: str) -> None:
    c = sub.add_parser(name, help=help)
    c.add_argument("--url", default="http://localhost:8000/v1",
                   help="the server's API base (default http://localhost:8000/v1)")
    c.add_argument("--model-name", default=None, help="default: the server's first model")
    c.add_argument("--api-key", default=None,
                   help="default: $VLLM_API_KEY, else $OPENAI_API_KEY, else none")
    c.add_argument("--max-tokens", type=int, default=None)
    c.add_argument("-q", "--quick", metavar="TEXT", default=None,
                   help="send one message/prompt, print the answer, exit")
    if name == "chat":
        c.add_argument("--system-prompt", default=None)


def main(argv: list[str] | None = None) -> int:
    from engine import interrupts

    previous = interrupts.install(argv[0] if argv else sys.argv[1] if len(sys.argv) > 1 else "")
    try:
        return _main(argv)
    finally:  # cli.main called in-process (tests, scripts) leaves SIGINT as it was
        interrupts.take_over()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="engine")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts")
    _common(g)
    g.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append")
    g.add_argument("--ignore-eos", action="store_true")
    b = sub.add_parser("bench", help="throughput on synthetic prompts")
    _common(b)
    b.add_argument("--num-prompts", type=int, default=16)
    b.add_argument("--input-len", type=int, default=32)
    b.add_argument("--output-len", type=int, default=128)
    _serve_parser(sub)
    _client_parser(sub, "chat", "chat with a running server (like `vllm chat`)")
    _client_parser(sub, "complete", "complete prompts on a running server (like `vllm complete`)")
    t = sub.add_parser("make-tiny-model", help="write a small random model (a Llama, or --arch) "
                       "with a tokenizer and a chat template, for trying the engine offline")
    t.add_argument("dir", help="a new folder")
    t.add_argument("--arch", default="llama", choices=tiny_model_archs(),
                   help="which architecture (default: llama)")
    t.add_argument("--seed", type=int, default=0)
    qz = sub.add_parser("quantize", help="write a quantized (compressed-tensors) copy of a "
                        "float checkpoint, by round to nearest")
    qz.add_argument("src", help="a Hugging Face checkpoint folder")
    qz.add_argument("dst", help="a new folder")
    qz.add_argument("--scheme", default="w8a8", choices=["w8a8", "w4a16"],
                    help="w8a8: int8 weights per channel, int8 activations per token; "
                    "w4a16: 4-bit weights per group, activations as they are")
    qz.add_argument("--group-size", type=int, default=128,
                    help="w4a16: input channels a scale covers (default 128)")
    env = sub.add_parser("env", help="print what this installation is and runs on")
    env.add_argument("--json", action="store_true")
    args = _parse(p, sub, argv)
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # `engine complete ... | head -c 80`: the reader left, quietly
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, as a program the pipe killed
    except ValueError as exc:  # configuration and input errors (EnvError included): one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        from engine._kernels import TorchMismatchError

        if not isinstance(exc, TorchMismatchError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler: one line, no traceback
        print(f"engine {args.command}: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        from engine.distributed.parallel_state import RankDiedError

        if not isinstance(exc, RankDiedError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _parse(p: argparse.ArgumentParser, sub, argv: list[str] | None) -> argparse.Namespace:
    """Parse argv; a mistyped command or option is refused by the command's
    own parser (its usage, not the top level's), with the nearest spelling."""
    import difflib

    argv = sys.argv[1:] if argv is None else list(argv)
    words = [a for a in argv if not a.startswith("-")]
    if words and words[0] not in sub.choices and argv and not argv[0].startswith("-"):
        near = difflib.get_close_matches(words[0], list(sub.choices), n=1)
        p.error(f"unknown command {words[0]!r}"
                + (f"; did you mean {near[0]!r}?" if near else
                   f"; choose from {', '.join(sub.choices)}"))
    args, extra = p.parse_known_args(argv)
    if extra and args.command == "serve":
        from engine.entrypoints.openai.cli_args import not_taken

        line = not_taken(extra)
        if line:
            print(f"error: {line}", file=sys.stderr)
            raise SystemExit(2)
    if extra:
        cmd = sub.choices[args.command]
        known = [o for a in cmd._actions for o in a.option_strings]
        hints = []
        for word in extra:
            near = difflib.get_close_matches(word.split("=")[0], known, n=1) \
                if word.startswith("-") else []
            hints.append(f"{word} (did you mean {near[0]}?)" if near else word)
        cmd.error(f"unrecognized arguments: {' '.join(hints)}")
    return args


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush then finds no
    closed pipe to complain of."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm-engine")
    except metadata.PackageNotFoundError:  # a source tree run without installing
        return "unknown (not installed)"


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


def client(args) -> int:
    from engine.entrypoints.cli_client import run

    return run(args)


def make_tiny_model(args) -> int:
    from engine.tiny_model import make_tiny_model as make
    from engine.tiny_pooling_model import POOLING_ARCHS, make_tiny_pooling_model

    if args.arch in POOLING_ARCHS:
        make = make_tiny_pooling_model
    path = make(args.dir, arch=args.arch, seed=args.seed)
    runner = " --runner pooling" if args.arch == "qwen3-embedding" else ""
    print(f"wrote a tiny random {args.arch} model to {path}; try: engine serve {path}{runner}")
    return 0


def quantize(args) -> int:
    from engine.model_executor.layers.quantization.rtn import quantize as run

    path = run(args.src, args.dst, args.scheme, group_size=args.group_size)
    print(f"wrote a {args.scheme} checkpoint to {path}; try: engine serve {path}")
    return 0


def env(args) -> int:
    from engine.collect_env import main as env_main

    return env_main(["--json"] if args.json else [])


COMMANDS = {"env": env, "generate": generate, "bench": bench, "serve": serve, "chat": client,
            "complete": client, "make-tiny-model": make_tiny_model,
            "quantize": quantize}


if __name__ == "__main__":
    sys.exit(main())
