"""The flag groups several `engine` sub-commands share, and the argument types
that check a flag's value before anything loads."""
from __future__ import annotations

import argparse


def common_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--enforce-eager", action="store_true",
                   help="run every decode step op by op, not replayed from a captured graph "
                   "(docs/decode-graphs.md)")


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


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
