"""`engine make-tiny-model`, `engine quantize` and `engine env`: the tools
around the engine."""
from __future__ import annotations


def add_parsers(sub) -> None:
    """`engine make-tiny-model`, `engine quantize` and `engine env`."""
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


def tiny_model_archs() -> list[str]:
    # no torch at import: `engine --help` stays fast
    from engine.tiny_model import ARCHS
    from engine.tiny_pooling_model import POOLING_ARCHS

    return [*ARCHS, *POOLING_ARCHS]


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
